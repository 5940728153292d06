"""Objects of a few thousand 1 KiB chunks (the smallest ``redis_chunk_size``) are
written and read in a bounded number of pipelined round trips, on one server and
on a cluster, and keep every guarantee.

Before, a write sent one ``SET`` per chunk and waited for it (four in flight):
N chunks, N round trips; ``cp`` staged and read back each chunk in a ``MULTI``
of its own. Round trips are counted by the real redis-server: ``INFO
commandstats`` counts commands, and ``INFO stats``' ``total_reads_processed``
(read events on client sockets) is at least one per round trip, so it bounds
them from above. Never timed.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import tensorstream
from tensorstream.copy import copy
from tensorstream.errors import ObjectChangedError
from tensorstream.testing.redis_server import RedisCluster, RedisServer

CS = 1 << 10
N = 3000
DATA = os.urandom(N * CS - 17)  # the last chunk is shorter
#: read events a round trip may cost: a 3 MB pipeline of 1 KiB values arrives in
#: ~16 KiB reads (redis-server's PROTO_IOBUF_LEN), about 190 of them.
ONE_READ_PER_CHUNK = N // 4


class Servers:
    """The nodes of a plain server or a cluster, and their counters."""

    def __init__(self, url: object, ports: list[int], host: str = "127.0.0.1") -> None:
        self.url = url
        self.ports = ports
        self.plain = len(ports) == 1
        self._clients = [redis.Redis(host=host, port=p) for p in ports]

    def counts(self) -> collections.Counter[str]:
        total: collections.Counter[str] = collections.Counter()
        for c in self._clients:
            info = c.info("all")
            for name, stats in info.items():
                if name.startswith("cmdstat_"):
                    total[name[len("cmdstat_"):]] += stats["calls"]
            total["read events"] += info["total_reads_processed"]
        return total

    def close(self) -> None:
        """Drop this module's keys (thousands: the shared servers' other tests
        scan them) and the clients."""
        for c in self._clients:
            keys = list(c.scan_iter(match="small/*", count=10_000))
            for key in keys:
                c.delete(key)  # (one by one: a cluster node holds slots, not all keys)
            c.close()


@pytest.fixture(params=["plain", "cluster"])
def servers(request: pytest.FixtureRequest) -> Iterator[Servers]:
    if request.param == "plain":
        srv: RedisServer = request.getfixturevalue("redis_server")
        s = Servers(srv.url, [srv.port])
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        s = Servers(cluster.url, cluster.ports)
    yield s
    s.close()


def _delta(servers: Servers, before: collections.Counter[str]) -> collections.Counter[str]:
    after = servers.counts()
    after.subtract(before)
    return collections.Counter({k: v for k, v in after.items()
                                if v and k not in ("info", "hello", "client")})


def _write(uri: str, data: bytes) -> None:
    with tensorstream.open(uri, "wb", redis_chunk_size=CS) as f:
        f.write(data)


def test_a_write_of_small_chunks_takes_few_round_trips(servers: Servers) -> None:
    key = f"small/w-{os.urandom(4).hex()}"
    before = servers.counts()
    _write(servers.url(key), DATA)  # type: ignore[operator]
    used = _delta(servers, before)
    assert used["set"] == N and used["persist"] == N, used
    assert used["read events"] < ONE_READ_PER_CHUNK, used  # was N + 27
    with tensorstream.open(servers.url(key)) as f:  # type: ignore[operator]
        assert f.read() == DATA


def test_a_copy_into_small_chunks_stages_and_reads_back_in_batches(
        servers: Servers, tmp_path: Path) -> None:
    src = tmp_path / "m"
    src.write_bytes(DATA)
    key = f"small/cp-{os.urandom(4).hex()}"
    before = servers.counts()
    result = copy(str(src), servers.url(key), redis_chunk_size=CS)  # type: ignore[operator]
    assert result.ok, result.errors
    used = _delta(servers, before)
    assert used["set"] == used["get"] == used["strlen"] == N, used  # each chunk read back
    assert used["read events"] < ONE_READ_PER_CHUNK, used  # was N + 25
    # a MULTI per batch of up to 4 MiB on one server (was one per chunk); none on a cluster
    assert 1 <= used["multi"] <= 3 if servers.plain else used["multi"] == 0, used
    with tensorstream.open(servers.url(key)) as f:  # type: ignore[operator]
        assert f.read() == DATA


@pytest.mark.parametrize("start,length", [(0, len(DATA)), (517, 100_000), (CS, 5 * CS),
                                          (len(DATA) - 3333, 3333), (1_500_001, 777_777)])
def test_reads_of_small_chunks_take_few_round_trips(servers: Servers, start: int,
                                                    length: int) -> None:
    key = "small/r"
    uri = servers.url(key)  # type: ignore[operator]
    _write(uri, DATA)
    before = servers.counts()
    with tensorstream.open(uri) as f:
        f.seek(start)
        assert f.read(length) == DATA[start: start + length]
    used = _delta(servers, before)
    assert used["read events"] < 60, used
    if servers.plain:  # runs of whole chunks in one MGET each (was a GETRANGE per chunk)
        assert used["mget"] >= 1 and used["getrange"] + used["mget"] < 100, used
    else:  # a cluster's keys of one MGET must share a slot: a GETRANGE per chunk
        assert used["mget"] == 0 and used["getrange"] >= length // CS, used


def test_a_chunk_changed_mid_object_fails_the_read(redis_server: RedisServer) -> None:
    """Chunks deep inside a batch (an MGET): gone, shorter or longer than the
    manifest says; read whole and in a range across the chunk."""
    uri = redis_server.url("small/changed")
    _write(uri, DATA)
    gen = tensorstream.open(uri).info.etag
    with redis_server.client() as c:
        # (a longer one was read as its first CS bytes: another value's, without a word)
        for offset, value in [(1234 * CS, None), (2000 * CS, b"x" * (CS - 1)),
                              (2500 * CS, b"y" * (CS + 1))]:
            chunk = f"small/changed:{gen}:{offset}"
            kept = c.get(chunk)
            c.delete(chunk) if value is None else c.set(chunk, value)
            with pytest.raises(ObjectChangedError, match=str(offset)):
                with tensorstream.open(uri) as f:
                    f.read()
            with pytest.raises(ObjectChangedError, match=str(offset)):
                _read(uri, offset - 10, 20)
            c.set(chunk, kept)
    with tensorstream.open(uri) as f:
        assert f.read() == DATA
    Servers(uri, [redis_server.port]).close()


def _read(uri: str, start: int, length: int) -> bytes:
    with tensorstream.open(uri) as f:
        f.seek(start)
        return f.read(length)


@pytest.mark.parametrize("how", ["write", "parts"])
def test_a_writer_keeps_no_record_per_chunk(redis_server: RedisServer, how: str) -> None:
    """A writer kept every chunk's key (and, for parts, its length in a dict):
    ~80-180 bytes a chunk, 3 GB for the 2**24 chunks a 1 KiB-chunk object may
    have. What it allocates is measured with tracemalloc, in the writer's two
    files (``writer.py``, ``publish.py``), after the commit (the writer still held)."""
    import asyncio
    import hashlib
    import tracemalloc

    from tensorstream.providers.redis import publish, writer

    chunks = 10_000
    data = os.urandom(chunks * CS)

    async def run() -> int:
        async with tensorstream.get_provider(redis_server.url(), redis_chunk_size=CS) as p:
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                w = p.open_writer(f"small/mem-{how}")
                if how == "write":
                    await w.write(data)
                    await w.commit()
                else:
                    part = w.part_size_for(len(data), 1 << 20)
                    assert part is not None
                    view = memoryview(data)
                    for i in range(-(-len(data) // part)):
                        await w.write_part(i, view[i * part: (i + 1) * part], md5=b"")
                    await w.commit_parts(-(-len(data) // part),
                                         sha256=hashlib.sha256(data).hexdigest())
                after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            assert w is not None  # (held to here)
        return sum(s.size_diff for s in after.compare_to(before, "filename")
                   if s.traceback[0].filename in (writer.__file__, publish.__file__))

    grown = asyncio.run(run())
    assert grown < 200_000, grown  # was ~0.8 MB (write) and ~1.8 MB (parts)
    with tensorstream.open(redis_server.url(f"small/mem-{how}")) as f:
        assert f.read() == data
    Servers(redis_server.url, [redis_server.port]).close()


def test_replacing_and_deleting_small_chunks_take_few_commands(servers: Servers) -> None:
    """The previous generation's chunks (dropped by a write over it) and a deleted
    object's go in one DEL per 1000 keys on one server (was a DEL per chunk);
    a cluster's keys of one DEL must share a slot: a DEL each there."""
    import asyncio

    uri = servers.url("small/del")  # type: ignore[operator]
    _write(uri, DATA)
    before = servers.counts()
    _write(uri, DATA[::-1])
    with tensorstream.open(uri) as f:
        assert f.read() == DATA[::-1]

    async def delete() -> None:
        async with tensorstream.get_provider(uri) as p:
            await p.delete("small/del")

    asyncio.run(delete())
    used = _delta(servers, before)
    # (+2: the publish's and the delete's scripts each DEL the manifest)
    assert used["del"] == 2 + (2 * -(-N // 1000) if servers.plain else 2 * N), used
    with pytest.raises(tensorstream.errors.NotFoundError):
        tensorstream.open(uri).close()
    with redis.Redis(host="127.0.0.1", port=servers.ports[0]) as c:
        assert not [k for k in c.scan_iter(match="small/del*") if servers.plain]


def test_writes_of_one_chunk_each_share_round_trips(redis_server: RedisServer) -> None:
    """The asyncio writer fed a chunk per ``write`` (as a serializer writing small
    tensors one by one does): each call waited for a free pipeline and sent its
    chunk alone. Chunks now wait for a free pipeline together, and a pipeline
    that ends sends them."""
    import asyncio

    servers = Servers(redis_server.url, [redis_server.port])
    before = servers.counts()

    async def run() -> None:
        async with tensorstream.get_provider(redis_server.url(), redis_chunk_size=CS) as p:
            w = p.open_writer("small/each")
            for i in range(0, len(DATA), CS):
                await w.write(DATA[i: i + CS])
            await w.commit()

    asyncio.run(run())
    used = _delta(servers, before)
    assert used["set"] == N and used["read events"] < ONE_READ_PER_CHUNK, used  # was N + 27
    with tensorstream.open(redis_server.url("small/each")) as f:
        assert f.read() == DATA
    servers.close()


def test_a_tensorizer_layout_is_read_by_ranges(redis_server: RedisServer) -> None:
    """Only tensorstream's own chunks (keys of a random generation nobody else
    writes) are fetched whole with MGET: a to_redis key may be written over with
    a value of any size (another model under the same prefix), and an MGET would
    receive all of it before finding it too long. GETRANGE asks for what the
    layout says, as before."""
    data = DATA[: 64 * CS]
    redis_server.put_tensorizer_layout("small/tz", data, piece=CS)
    servers = Servers(redis_server.url, [redis_server.port])
    before = servers.counts()
    with tensorstream.open(redis_server.url("small/tz")) as f:
        assert f.read() == data
    used = _delta(servers, before)
    assert used["mget"] == 0 and used["getrange"] >= 64, used  # (and the header key)
    servers.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("old", [
    # A corrupt manifest claiming 10**15 one-byte chunks: its keys were generated one
    # by one and deleted 10,000 a round trip, for ever (listed, it was a MemoryError).
    {"tensorstream": "1", "generation": "0123456789abcdef", "size": str(10**15),
     "chunk_size": "1"},
    # A hash of someone else's that names a generation: not a manifest, nothing of
    # ours, so its keys were never this writer's to delete.
    {"generation": "theirs", "size": "3", "chunk_size": "1"},
], ids=["corrupt-manifest", "not-a-manifest"])
def test_a_write_over_a_hash_that_is_no_sound_manifest_deletes_only_its_own(
        redis_server: RedisServer, old: dict[str, str],
        caplog: pytest.LogCaptureFixture) -> None:
    uri = redis_server.url("small/over")
    with redis_server.client() as c:
        c.hset("small/over", mapping=old)
        theirs = {f"small/over:{old['generation']}:{i}".encode(): b"k" for i in range(3)}
        c.mset(theirs)
    _write(uri, DATA[: 10 * CS])
    with tensorstream.open(uri) as f:
        assert f.read() == DATA[: 10 * CS]
    with redis_server.client() as c:
        assert c.mget(list(theirs)) == [b"k"] * 3  # (the corrupt one's: left, with a word)
    if "tensorstream" in old:
        assert "previous generation" in caplog.text and "corrupt" in caplog.text
    Servers(uri, [redis_server.port]).close()
