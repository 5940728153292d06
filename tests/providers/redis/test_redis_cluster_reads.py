"""Reads from a Redis Cluster whose slots move mid-read: a node answering ``MOVED``
(the slot is another node's now) or ``ASK`` (the slot is migrating and the key has
gone ahead) is followed, and the reader's bytes are exact. The cluster is this
module's own: the slots it moves stay moved (or migrating)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import tensorstream
from tensorstream.testing.redis_server import RedisCluster, redis_available

CHUNK = 4096
DATA = os.urandom(50 * CHUNK + 123)


@pytest.fixture(scope="module")
def cluster(redis_tmp: str) -> Iterator[RedisCluster]:
    if not redis_available():
        pytest.skip("redis-server/redis-cli not installed (apt-get install redis-server)")
    with RedisCluster(3, tmp_dir=redis_tmp) as started:
        yield started


def _move_keys(cluster: RedisCluster, match: str, *, finish: bool) -> int:
    """Migrate every key matching ``match`` to the next node: its slot is left
    ``MIGRATING``/``IMPORTING`` (the old node answers ``ASK``), or with ``finish``
    given to that node (every node answers ``MOVED`` for it)."""
    import redis
    from redis.cluster import key_slot

    nodes = [redis.Redis(host=cluster.host, port=port) for port in cluster.ports]
    ids = [node.execute_command("CLUSTER", "MYID").decode() for node in nodes]
    moved = 0
    try:
        for key in list(cluster.client().scan_iter(match=match)):
            slot = key_slot(key)
            src = cluster.ports.index(cluster.client().get_node_from_key(key).port)
            dst = (src + 1) % len(nodes)
            nodes[dst].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
            nodes[src].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
            nodes[src].execute_command("MIGRATE", cluster.host, cluster.ports[dst], "", 0, 5000,
                                       "KEYS", key)
            if finish:
                for node in nodes:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst])
            moved += 1
    finally:
        for node in nodes:
            node.close()
    return moved


@pytest.mark.parametrize("answer", ["MOVED", "ASK"])
def test_a_read_follows_slots_that_move_mid_read(cluster: RedisCluster, answer: str) -> None:
    key = f"moving-{answer.lower()}"
    with tensorstream.open(cluster.url(key), "wb", redis_chunk_size=CHUNK) as w:
        w.write(DATA)
    with tensorstream.open(cluster.url(key), redis_chunk_size=CHUNK, part_size=16 << 10) as f:
        first = f.read(1000)  # the layout and the slot map are known now
        assert _move_keys(cluster, f"{key}*", finish=answer == "MOVED") > 40
        assert first + f.read() == DATA
    # A later reader (a fresh slot map) reads it too.
    with tensorstream.open(cluster.url(key), redis_chunk_size=CHUNK) as f:
        assert f.read() == DATA
