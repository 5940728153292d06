"""A write to a Redis Cluster survives a dropped connection, as one to a single server
does (``test_redis_write_drops.py``): each chunk's ``SET``, the ``PERSIST`` of the chunks
and the publish are sent again under the retry policy, whichever node they went to; a
node that stays down fails the write after the budget with the old object whole.

A real 3-primary cluster (``tensorstream.testing.RedisCluster``) with the package's TCP
fault proxy in front of each node: each node announces its proxy's port
(``cluster-announce-port``), so the cluster client's every connection, after the slot
map too, goes through a proxy. Its own cluster, not the session's: the announced ports
stay for its life.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest
from redis_cuts import STEPS, Cut

import tensorstream
from tensorstream import errors
from tensorstream.testing.redis_server import RedisCluster, redis_available
from tensorstream.testing.tcp_proxy import TCPFaultProxy

CS = 16 << 10
#: A quick budget (the policy's own numbers), so a node that stays down fails quickly.
FAST = {"redis_chunk_size": CS, "retries": 4, "backoff_initial": 0.01, "backoff_max": 0.05,
        "redis_cluster": True}
#: What each step's burst holds (as in test_redis_write_drops.py).
class _Fronted:
    """The cluster, a fault proxy per node, and a plain cluster client to look with."""

    def __init__(self, cluster: RedisCluster, proxies: list[TCPFaultProxy]) -> None:
        import redis

        self.cluster, self.proxies = cluster, proxies
        self.client = redis.RedisCluster(host=cluster.host, port=cluster.ports[0])

    def uri(self, key: str) -> str:
        return f"redis://{self.cluster.host}:{self.proxies[0].port}/{key}"

    def write(self, key: str, data: bytes) -> None:
        with tensorstream.open(self.uri(key), "wb", **FAST) as f:
            f.write(data)

    def read(self, key: str) -> bytes:
        for proxy in self.proxies:
            proxy.faults.reset()
        with tensorstream.open(self.uri(key), "rb", **FAST) as f:
            return f.read()

    def ours_left(self, key: str) -> list[bytes]:
        """Chunks of ``key`` without their expiry but the published generation's."""
        import redis

        gen = self.client.hget(key, "generation")
        mine = None if gen is None else f":{gen.decode()}:".encode()
        keys = self.client.scan_iter(match=f"{key}:*", count=10_000,
                                     target_nodes=redis.RedisCluster.ALL_NODES)
        return [k for k in keys if self.client.ttl(k) == -1 and (mine is None or mine not in k)]


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Fronted]:
    if not redis_available():
        pytest.skip("redis-server is not installed")
    import redis

    with RedisCluster(3, tmp_dir=tmp_path_factory.mktemp("cluster")) as cluster, \
            contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(TCPFaultProxy(cluster.host, port))
                   for port in cluster.ports]
        for port, proxy in zip(cluster.ports, proxies, strict=True):
            with redis.Redis(host=cluster.host, port=port) as node:
                node.config_set("cluster-announce-port", proxy.port)
        want, deadline = {p.port for p in proxies}, time.monotonic() + 30
        while True:  # (the nodes tell each other by gossip)
            seen = set()
            for port in cluster.ports:
                with redis.Redis(host=cluster.host, port=port) as node:
                    seen |= {int(s[2][1]) for s in node.execute_command("CLUSTER", "SLOTS")}
            if seen == want:
                break
            assert time.monotonic() < deadline, f"the nodes announce {seen}, not {want}"
            time.sleep(0.1)
        yield _Fronted(cluster, proxies)
        for proxy in proxies:
            proxy.faults.reset()


@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("how", ["lost", "answered"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_cluster_write_survives_a_drop_at_each_step(fronted: _Fronted, step: str, how: str,
                                                      times: int) -> None:
    """Each node cuts the step's command (or its answer) ``times`` times: the write is
    sent again on each node and reads back exactly; no chunk of it is left persistent but
    the published generation's."""
    key = f"drop-{step}-{how}-{times}"
    fronted.write(key, os.urandom(40_000))
    cuts = []
    for proxy in fronted.proxies:
        proxy.faults.reset()
        cuts.append(Cut(proxy.faults, STEPS[step], how, times))
        proxy.faults.on_client_data = cuts[-1]
    data = os.urandom(300_000)  # 19 chunks, on every node
    fronted.write(key, data)
    assert sum(c.cut for c in cuts) >= 1
    assert fronted.read(key) == data
    assert fronted.ours_left(key) == []


@pytest.mark.parametrize("node", [0, 1, 2])
def test_a_cluster_node_that_stays_down_fails_the_write_and_keeps_the_old_object(
        fronted: _Fronted, node: int) -> None:
    """A node whose connections are refused and cut midway through the write, for good:
    the write fails with a temporary ConnectionFailedError after the budget, the old object
    reads back whole, and nothing of the new one is left persistent. The neighbour: a node
    that refuses two connections and comes back takes the write."""
    for refused, ok in ((2, True), (10_000, False)):
        key = f"down-{node}-{refused}"
        old, data = os.urandom(40_000), os.urandom(300_000)
        fronted.write(key, old)
        for proxy in fronted.proxies:
            proxy.faults.reset()
        raised: BaseException | None = None
        try:
            with tensorstream.open(fronted.uri(key), "wb", **FAST) as f:
                f.write(data[:150_000])
                f.flush()
                fronted.proxies[node].faults.refuse = refused
                fronted.proxies[node].cut_all()
                f.write(data[150_000:])
        except errors.ConnectionFailedError as exc:
            raised = exc
        assert (raised is None) == ok, raised
        if raised is not None:
            assert raised.temporary
        assert fronted.read(key) == (data if ok else old)
        assert fronted.ours_left(key) == []


def test_redis_py_losing_track_of_redirections_is_a_temporary_error_quoting_no_bytes() -> None:
    """During a resharding (slots ``MIGRATING``) redis-py, with several of a write's
    pipelines in flight, loses track of their ``ASK`` redirections and raises
    ``ClusterError`` ("TTL exhausted"; seen with this module's cluster, intermittently).
    The write failed with a permanent ``ProtocolError`` quoting the pipeline's command, a
    chunk's raw bytes included. It is a temporary error now (sent again), quoting none."""
    from redis.exceptions import ClusterError

    from tensorstream.providers.redis.errors import map_redis_error

    chunk = bytes(range(256)).decode("latin-1")
    raised = ClusterError(f"Command # 3 (SET k:0123456789abcdef:98304 {chunk}...) of "
                          "pipeline caused error: TTL exhausted.")
    err = map_redis_error(raised)
    assert isinstance(err, errors.ServiceUnavailableError) and err.temporary
    assert "kept redirecting" in str(err) and "TTL exhausted" in str(err)
    assert "SET" not in str(err) and "\x00" not in str(err) and "k:0123" not in str(err)
