"""Redis layout and reliability: manifest + generation chunks, atomic overwrite, pinned
readers, vanished chunks, glob-safe prefixes, cancellation, pauses, cluster fan-out."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.redis_server import RedisCluster, RedisServer

CS = 64 << 10


def _write(uri: str, data: bytes, **opts: object) -> None:
    with tensorstream.open(uri, "wb", redis_chunk_size=CS, **opts) as w:
        w.write(data)


def test_layout_manifest_and_generation_chunks(redis_server: RedisServer) -> None:
    data = os.urandom(5 * CS + 123)
    _write(redis_server.url("lay/obj"), data)
    with redis_server.client() as c:
        m = {k.decode(): v.decode() for k, v in c.hgetall("lay/obj").items()}
        assert m["size"] == str(len(data)) and m["chunk_size"] == str(CS)
        assert m["checksum"].startswith("sha256:")
        gen = m["generation"]
        chunks = sorted(c.scan_iter(match="lay/obj:*"))
        assert len(chunks) == 6
        assert all(k.decode().startswith(f"lay/obj:{gen}:") for k in chunks)
        assert all(c.pttl(k) == -1 for k in chunks)  # staging TTL removed on commit
        assert c.get(f"lay/obj:{gen}:{5 * CS}") == data[5 * CS :]
    info = tensorstream.open(redis_server.url("lay/obj")).info
    assert info.etag == gen
    _write(redis_server.url("lay/obj"), b"v2" * 10)
    with redis_server.client() as c:
        left = list(c.scan_iter(match="lay/obj:*"))
        assert len(left) == 1 and gen.encode() not in left[0]  # old generation removed


def _staged(redis_server: RedisServer, match: str) -> None:
    """Wait for the chunks of a full write buffer (128) to land: the last
    batches of a write may still be on their way when it returns."""
    deadline = time.monotonic() + 10
    with redis_server.client() as c:
        while len(list(c.scan_iter(match=match, count=1000))) < 128:
            assert time.monotonic() < deadline, "the staged chunks never landed"
            time.sleep(0.01)


def test_a_write_not_yet_published_is_not_an_object(redis_server: RedisServer) -> None:
    """Chunks staged by a write in progress (or left to expire by one that died)
    look like tensorizer's ``K:<name>:<offset>`` keys; they were read as a
    tensorizer-layout object: the first chunks of an unfinished write."""
    data = os.urandom(9 << 20)
    with tensorstream.open(redis_server.url("lay/unpublished"), "wb", redis_chunk_size=CS) as w:
        w.write(data[: 8 << 20])  # a full write buffer: sent as chunks (a few still on the way)
        _staged(redis_server, "lay/unpublished:*")  # with their expiry
        with pytest.raises(errors.NotFoundError):
            tensorstream.open(redis_server.url("lay/unpublished")).close()
        w.write(data[8 << 20:])
    with tensorstream.open(redis_server.url("lay/unpublished")) as f:
        assert f.read() == data


def test_a_write_not_yet_published_is_not_listed(redis_server: RedisServer) -> None:
    """The listing's side of the test above: the staged chunks of a first write
    to a name, in progress or left by a writer that died, were listed (``ls``,
    and copied by ``cp -r``/``sync``) as one string object per chunk. They are
    left out until the manifest names them; an object beside them still is listed."""
    _write(redis_server.url("lsu/beside"), b"x" * 10)

    async def names() -> list[str]:
        async with tensorstream.get_provider(redis_server.url("lsu/")) as p:
            return [o.path async for o in p.list("lsu/")]

    with tensorstream.open(redis_server.url("lsu/unpublished"), "wb", redis_chunk_size=CS) as w:
        w.write(os.urandom(8 << 20))  # a full write buffer: sent as chunks
        _staged(redis_server, "lsu/unpublished:*")
        assert asyncio.run(names()) == ["lsu/beside"]
    assert asyncio.run(names()) == ["lsu/beside", "lsu/unpublished"]


def test_tensorizer_keys_with_an_expiry_are_still_listed(redis_server: RedisServer) -> None:
    """The neighbour: tensorizer's own keys with an expiry (not named like a
    staged chunk) stay one object in the listing."""
    redis_server.put_tensorizer_layout("lsx/tz", os.urandom(3 * CS + 7), piece=CS)
    with redis_server.client() as c:
        for k in c.scan_iter(match="lsx/tz:*"):
            c.pexpire(k, 600_000)

    async def names() -> list[str]:
        async with tensorstream.get_provider(redis_server.url("lsx/")) as p:
            return [o.path async for o in p.list("lsx/")]

    assert asyncio.run(names()) == ["lsx/tz"]


def test_tensorizer_keys_with_an_expiry_are_still_an_object(redis_server: RedisServer) -> None:
    data = os.urandom(3 * CS + 7)
    redis_server.put_tensorizer_layout("lay/tz-expiring", data, piece=CS)
    with redis_server.client() as c:
        for k in c.scan_iter(match="lay/tz-expiring:*"):
            c.pexpire(k, 600_000)
    with tensorstream.open(redis_server.url("lay/tz-expiring")) as f:
        assert f.read() == data


def test_chunks_whose_manifest_is_gone_are_no_object(redis_server: RedisServer) -> None:
    """A manifest evicted (maxmemory-policy allkeys-lru) or removed by a delete cut
    short leaves persistent chunks ``K:<generation>:<offset>``. They were read as a
    tensorizer prefix: with the last chunk gone too, ``read()`` returned the object
    short, without an error, and ``ls`` listed every chunk as an object."""
    data = os.urandom(5 * CS + 100)
    _write(redis_server.url("orph/obj"), data)
    _write(redis_server.url("orph/beside"), b"x" * 10)
    with redis_server.client() as c:
        gen = c.hget("orph/obj", "generation").decode()
        c.delete("orph/obj", f"orph/obj:{gen}:{5 * CS}")  # the manifest and the last chunk
    with pytest.raises(errors.NotFoundError, match=r"5 chunk.* no manifest naming them"):
        tensorstream.open(redis_server.url("orph/obj")).close()

    async def names() -> list[str]:
        async with tensorstream.get_provider(redis_server.url("orph/")) as p:
            return [o.path async for o in p.list("orph/")]

    assert asyncio.run(names()) == ["orph/beside"]

    async def rm() -> None:
        async with tensorstream.get_provider(redis_server.url("orph/")) as p:
            await p.delete("orph/obj")  # what is left of it, under its name
            with pytest.raises(errors.NotFoundError):
                await p.delete("orph/obj")

    asyncio.run(rm())
    with redis_server.client() as c:
        assert sorted(c.scan_iter(match="orph/obj*")) == []


def test_a_manifest_whose_generation_names_other_objects_keys_never_deletes_them(
        redis_server: RedisServer) -> None:
    """Only ``K:<16 hex>:<offset>`` is a chunk of ``K``; a hash claiming the generation
    ``v2`` named the plain strings ``K:v2:0``... as its chunks (``ls`` lists them as
    objects of their own): it read them, and ``rm K`` or a write over ``K`` deleted them."""
    theirs = {f"gen/k:v2:{i}": b"abc"[i:i + 1] for i in range(3)}
    fields = {"tensorstream": "1", "size": "3", "chunk_size": "1", "generation": "v2"}
    with redis_server.client() as c:
        c.mset(theirs)
        c.hset("gen/k", mapping=fields)
    with pytest.raises(errors.ProtocolError, match="generation 'v2' is not 16 hex digits"):
        tensorstream.open(redis_server.url("gen/k")).close()

    async def rm_and_list() -> list[str]:
        async with tensorstream.get_provider(redis_server.url("gen/")) as p:
            await p.delete("gen/k")  # removed as a damaged object: its manifest only
            return [o.path async for o in p.list("gen/")]

    assert asyncio.run(rm_and_list()) == sorted(theirs)
    with redis_server.client() as c:
        c.hset("gen/k", mapping=fields)
    _write(redis_server.url("gen/k"), b"new")  # a write over it leaves them too
    with redis_server.client() as c:
        assert c.mget(list(theirs)) == list(theirs.values())
    with tensorstream.open(redis_server.url("gen/k")) as f:
        assert f.read() == b"new"


def test_a_tensorizer_tensor_named_like_a_generation_is_still_read(
        redis_server: RedisServer) -> None:
    """The neighbour: a to_redis prefix (its ``:header:0`` there) whose tensor is
    named with 16 hex digits stays one object, read and listed."""
    head, body = os.urandom(100), os.urandom(2 * CS)
    with redis_server.client() as c:
        c.set("tzhex/m:header:0", head)
        c.set(f"tzhex/m:0123456789abcdef:{len(head)}", body)
    with tensorstream.open(redis_server.url("tzhex/m")) as f:
        assert f.read() == head + body

    async def names() -> list[str]:
        async with tensorstream.get_provider(redis_server.url("tzhex/")) as p:
            return [o.path async for o in p.list("tzhex/")]

    assert asyncio.run(names()) == ["tzhex/m"]


def test_aborted_write_leaves_nothing(redis_server: RedisServer) -> None:
    with pytest.raises(RuntimeError):
        with tensorstream.open(redis_server.url("lay/aborted"), "wb", redis_chunk_size=CS) as w:
            w.write(os.urandom(3 * CS))
            raise RuntimeError("stop")
    with redis_server.client() as c:
        assert list(c.scan_iter(match="lay/aborted*")) == []


def test_pinned_reader_sees_change_not_mix(redis_server: RedisServer) -> None:
    uri = redis_server.url("lay/pinned")
    _write(uri, b"A" * (4 * CS))
    # readahead=0, small parts: the rest is fetched after the overwrite.
    with tensorstream.open(uri, retries=1, readahead=0, part_size=CS) as f:
        assert f.read(10) == b"A" * 10
        _write(uri, b"B" * (4 * CS))
        with pytest.raises(errors.ObjectChangedError):
            f.read()


def test_a_plain_string_replaced_by_an_object_of_its_size_is_a_change(
        redis_server: RedisServer) -> None:
    """A plain string has no version, so a read of one is pinned by its size only;
    replaced mid-read by a tensorstream object of the same size, the read went on
    in the new object's bytes (a mix). A manifest always has an ETag: a pin without
    one that meets a manifest is a change."""
    uri = redis_server.url("lay/str-then-obj")
    redis_server.put("lay/str-then-obj", b"A" * (4 * CS))
    with tensorstream.open(uri, retries=1, readahead=0, part_size=CS) as f:
        assert f.read(10) == b"A" * 10
        _write(uri, b"B" * (4 * CS))
        with pytest.raises(errors.ObjectChangedError):
            f.read()


def test_chunk_deleted_mid_read_is_an_error(redis_server: RedisServer) -> None:
    uri = redis_server.url("lay/holed")
    _write(uri, os.urandom(4 * CS))
    with tensorstream.open(uri, retries=1) as f:
        with redis_server.client() as c:
            c.delete(f"lay/holed:{f.etag}:{2 * CS}")
        with pytest.raises(errors.ObjectChangedError):
            f.read()
    # Same for a tensorizer-layout prefix losing a piece.
    redis_server.put_tensorizer_layout("lay/tzholed", os.urandom(3 * CS), piece=CS)
    with tensorstream.open(redis_server.url("lay/tzholed"), retries=1) as f:
        with redis_server.client() as c:
            c.delete(f"lay/tzholed:data:{CS // 3 + CS}")
        with pytest.raises(errors.ObjectChangedError):
            f.read()


def test_overwrite_under_concurrent_readers_is_atomic(redis_server: RedisServer) -> None:
    uri = redis_server.url("lay/racing")
    versions = [bytes([i]) * (6 * CS + 17) for i in range(1, 6)]
    _write(uri, versions[0])
    seen: list[bytes] = []
    changed = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal changed
        while not stop.is_set():
            try:
                with tensorstream.open(uri, retries=1, part_size=CS) as f:
                    seen.append(f.read())
            except errors.ObjectChangedError:
                changed += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for v in versions[1:] * 4:
            _write(uri, v)
        # On a loaded machine every read may overlap a write (each then raises
        # ObjectChangedError); a read after the last write must still succeed.
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert seen, "readers never completed a read"
    assert all(s in versions for s in seen), "a read mixed two versions"


def test_glob_characters_in_prefix_match_only_themselves(redis_server: RedisServer) -> None:
    for name in ("g/a*b?[x]", "g/a*b?[x]/in", "g/aXbY", "g/a*bZx", "g/ab"):
        redis_server.put(name, b"12345")

    async def names(prefix: str) -> list[str]:
        async with tensorstream.get_provider(redis_server.url()) as p:
            return [i.path async for i in p.list(prefix)]

    assert asyncio.run(names("g/a*b?[x]")) == ["g/a*b?[x]", "g/a*b?[x]/in"]
    assert asyncio.run(names("g/a*")) == ["g/a*b?[x]", "g/a*b?[x]/in", "g/a*bZx"]
    # tensorizer fallback scan for a missing key with glob characters finds nothing else
    with pytest.raises(FileNotFoundError):
        tensorstream.open(redis_server.url("g/a[*]"))


def test_list_reports_each_layout_once(redis_server: RedisServer) -> None:
    _write(redis_server.url("ls/manifest"), os.urandom(3 * CS))
    redis_server.put("ls/plain", b"xyz")
    redis_server.put_tensorizer_layout("ls/tz", os.urandom(2 * CS + 5), piece=CS)

    async def run() -> list[tuple[str, int, str]]:
        async with tensorstream.get_provider(redis_server.url()) as p:
            return [(i.path, i.size, i.extra["layout"]) async for i in p.list("ls/")]

    assert asyncio.run(run()) == [
        ("ls/manifest", 3 * CS, "manifest"),
        ("ls/plain", 3, "string"),
        ("ls/tz", 2 * CS + 5, "tensorizer"),
    ]

    async def delete_all() -> None:
        async with tensorstream.get_provider(redis_server.url()) as p:
            for name in ("ls/manifest", "ls/plain", "ls/tz"):
                await p.delete(name)
            with pytest.raises(FileNotFoundError):
                await p.delete("ls/manifest")

    asyncio.run(delete_all())
    with redis_server.client() as c:
        assert list(c.scan_iter(match="ls/*")) == []


async def test_cancelled_reads_leave_the_pool_consistent(redis_server: RedisServer) -> None:
    big = os.urandom(24 << 20)
    small = os.urandom(100_000)
    redis_server.put("cancel/big", big)
    redis_server.put("cancel/small", small)
    async with tensorstream.get_provider(redis_server.url(), retries=1) as p:
        inner = p.inner
        cancelled = 0
        for i in range(12):
            task = asyncio.ensure_future(p.read_range("cancel/big", 0, len(big)))
            await asyncio.sleep(0.001 * (i % 6))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            cancelled += task.cancelled()
            # The very next requests on the same pool must get their own replies.
            assert await p.read_range("cancel/small", 10, 5010) == small[10:5010]
            assert await p.read_range("cancel/big", 1 << 20, (1 << 20) + 999) == \
                big[1 << 20 : (1 << 20) + 999]
        assert cancelled >= 1  # at least some reads were stopped mid-flight
        pool = inner.client().connection_pool
        assert len(pool._in_use_connections) == 0


async def test_paused_server_times_out() -> None:
    with RedisServer() as srv:
        srv.put("paused", b"x" * 1000)
        with srv.client() as admin:
            admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")
            with pytest.raises(TimeoutError) as info:
                await tensorstream.read_range(srv.url("paused"), 0, 10, timeout_idle=0.3,
                                              retries=1)
            assert isinstance(info.value, errors.StorageTimeoutError)


def test_cluster_chunks_fan_out_over_all_nodes(redis_cluster: RedisCluster) -> None:
    data = os.urandom(24 * CS)
    uri = redis_cluster.url("fanout/model")
    _write(uri, data)
    import redis

    per_node = []
    for port in redis_cluster.ports:
        with redis.Redis(host=redis_cluster.host, port=port) as c:
            per_node.append(len(list(c.scan_iter(match="fanout/model:*"))))
    assert sum(per_node) == 24 and all(n > 0 for n in per_node), per_node
    with tensorstream.open(uri) as f:
        assert f.read() == data
    _write(uri, data[: 3 * CS])  # overwrite: old generation removed on every node
    with redis_cluster.client() as c:
        assert c.type("fanout/model") == b"hash"
        assert len(list(c.scan_iter(match="fanout/model:*"))) == 3
    with tensorstream.open(uri) as f:
        assert f.read() == data[: 3 * CS]


async def test_a_provider_keeps_one_client_per_loop(redis_server: RedisServer) -> None:
    """A read from a worker thread hops to the I/O loop; the client of the caller's
    loop was then replaced, dropped unclosed (its connections leaked), and made
    again on the next hop back."""
    redis_server.put("loops/k", b"x" * 100)
    async with tensorstream.get_provider(redis_server.url("loops/k")) as p:
        inner = p.inner
        first = inner.client()
        await asyncio.to_thread(inner.readinto_blocking, "loops/k", 0, memoryview(bytearray(10)))
        assert inner.client() is first
        assert len(inner._clients) == 2  # the I/O loop's too


def test_a_copy_between_cluster_keys_closes_its_clients(redis_cluster: RedisCluster) -> None:
    """The user-visible side: ``cp`` from a cluster printed "Unclosed RedisCluster
    client" (and "Unclosed ClusterNode object") at exit, one per hop between loops."""
    data = os.urandom(200 * CS)  # read by several read-ahead workers
    _write(redis_cluster.url("closing/model"), data)
    out = subprocess.run([sys.executable, "-m", "tensorstream", "cp",
                          redis_cluster.url("closing/model"), redis_cluster.url("closing/copy")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Unclosed" not in out.stderr, out.stderr
    with tensorstream.open(redis_cluster.url("closing/copy")) as f:
        assert f.read() == data


def test_a_key_ending_in_a_line_break_is_not_a_tensorizer_piece(redis_server: RedisServer) -> None:
    """``K:data:<offset>\\n`` is a key of its own, not the piece at that offset: its
    bytes were taken into the object (a stray key mixed into the stream), and
    its neighbours (a trailing space, a second line) are no piece either."""
    data = os.urandom(2 * CS + 5)
    redis_server.put_tensorizer_layout("lay/tz-nl", data, piece=CS)
    with redis_server.client() as c:
        c.set(f"lay/tz-nl:data:{len(data)}\n", b"stray bytes")
        c.set(f"lay/tz-nl:data:{len(data)} ", b"stray bytes")
        c.set(f"lay/tz-nl:data:{len(data)}\n7", b"stray bytes")
    with tensorstream.open(redis_server.url("lay/tz-nl")) as f:
        assert f.read() == data


def test_a_key_named_like_a_chunk_of_an_object_beside_it_is_listed(
        redis_server: RedisServer) -> None:
    """``SET m:1``, ``m:v2`` or ``m:1:2`` beside the object ``m`` are keys of their own:
    any ``...:<digits>`` key whose name before a ``:`` was an object's was taken for one
    of its chunks and left out of ``ls``, ``cp -r`` and ``sync`` (which then deleted its
    copy at the destination). Only ``m:<16 hex digits>:<offset>`` is named as a chunk."""
    _write(redis_server.url("chk/m"), os.urandom(CS + 1))
    with redis_server.client() as c:
        gen = c.hget("chk/m", "generation").decode()
        for name in ("chk/m:1", "chk/m:v2:3", "chk/m:1:2", "chk/m:0123456789abcdeg:0"):
            c.set(name, name.encode())
        # a stale chunk of an older generation (a replace cut short) is still no object
        c.set("chk/m:0123456789abcdef:0", b"old chunk")

    async def names() -> list[str]:
        async with tensorstream.get_provider(redis_server.url()) as p:
            return [i.path async for i in p.list("chk/")]

    assert asyncio.run(names()) == [
        "chk/m", "chk/m:0123456789abcdeg:0", "chk/m:1", "chk/m:1:2", "chk/m:v2:3"]
    assert f"chk/m:{gen}:0" not in asyncio.run(names())
