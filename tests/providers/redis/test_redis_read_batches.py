"""A read's pipelines (``blocking.batches``) are planned one batch at a time, on the
blocking path and on the event loop, against a real redis-server.

Before, every batch of a read was built up front: a ``readinto`` of 1 GiB of 1 KiB
chunks held a million entries (~320 MB of Python objects) before its first byte
arrived. Memory is measured with tracemalloc; bytes stay exact or the read raises."""

from __future__ import annotations

import dataclasses
import os
import tracemalloc
from collections.abc import Iterator

import pytest

import tensorstream
from tensorstream import _loop
from tensorstream.errors import IncompleteReadError, ObjectChangedError
from tensorstream.providers.base import Pin
from tensorstream.providers.redis.blocking import BATCH_BYTES, batches
from tensorstream.providers.redis.layout import Layout
from tensorstream.testing.backends import RedisBackend
from tensorstream.testing.redis_server import RedisServer

CS = 1 << 10


@pytest.fixture
def written(redis_server: RedisServer) -> Iterator[tuple[str, bytes]]:
    """An object of 1 KiB chunks spanning three batches (the last one short)."""
    key = f"batches/{os.urandom(4).hex()}"
    data = os.urandom(2 * BATCH_BYTES + 3 * CS + 17)
    with tensorstream.open(redis_server.url(key), "wb", redis_chunk_size=CS) as f:
        f.write(data)
    yield key, data
    with redis_server.client() as c:
        for k in list(c.scan_iter(match=f"{key}*", count=10_000)):
            c.delete(k)


def _layout(redis_server: RedisServer, key: str) -> tuple[tensorstream.Provider, Layout, Pin]:
    p = tensorstream.get_provider(redis_server.url(key))
    info = _loop.run_sync(p.stat(key))
    layout = _loop.run_sync(p.inner.resolve(key))
    return p, layout, Pin.of(info)


def test_a_huge_read_s_batches_are_planned_one_at_a_time(
        redis_server: RedisServer, written: tuple[str, bytes]) -> None:
    """The layout of a real object of 1 KiB chunks, as if it were 256 MiB: planning its
    read held ~70 MB at once (~320 MB for 1 GiB); now about two batches' entries. The pieces still cover
    the range exactly, in order, each batch at most BATCH_BYTES."""
    key, _ = written
    p, layout, _ = _layout(redis_server, key)
    _loop.run_sync(p.close())
    huge = dataclasses.replace(layout, size=256 << 20)
    offset, want = 517, (256 << 20) - 517 - 3
    tracemalloc.start()
    try:
        pos = count = 0
        for batch in batches(huge, offset, want):
            assert sum(e[2] for e in batch) <= BATCH_BYTES
            for _key, start, n, at, whole in batch:
                assert at == pos and (offset + pos) % CS == start and 0 < n <= CS
                assert whole == (start == 0 and n == CS)
                pos += n
            count += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pos == want and count == -(-want // BATCH_BYTES)
    assert peak < 12 << 20, f"planning a 256 MiB read held {peak / 1e6:.0f} MB at once"


@pytest.mark.parametrize("path", ["loop", "blocking"])
def test_reads_across_batches_are_exact_or_raise(
        redis_server: RedisServer, written: tuple[str, bytes], path: str) -> None:
    """Whole and in ranges across batch boundaries, on the event loop and on the
    blocking path; a chunk of a later batch changed is an ObjectChangedError."""
    key, data = written
    p, layout, pin = _layout(redis_server, key)

    def read(offset: int, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = (_loop.run_sync(p.inner.readinto(key, offset, view, pin=pin)) if path == "loop"
               else p.inner.readinto_blocking(key, offset, view, pin=pin))
        assert got == n
        return bytes(buf)

    try:
        for offset, n in [(0, len(data)), (BATCH_BYTES - 5, 10), (1, 2 * BATCH_BYTES),
                          (len(data) - BATCH_BYTES - 1, BATCH_BYTES + 1)]:
            assert read(offset, n) == data[offset: offset + n], (offset, n)
        late = (2 * BATCH_BYTES // CS + 1) * CS  # a chunk of the third batch
        with redis_server.client() as c:
            c.set(f"{key}:{layout.generation}:{late}".encode(), b"x" * (CS - 1))
        for offset, n in [(0, len(data)), (BATCH_BYTES, len(data) - BATCH_BYTES)]:
            with pytest.raises(ObjectChangedError, match=str(late)):
                read(offset, n)
    finally:
        _loop.run_sync(p.close())


def test_a_broken_read_on_the_loop_reports_the_batches_received_in_order(
        tensorstream_redis: RedisBackend) -> None:
    """Four batches in flight, each on its connection: one cut in the fifth batch raises
    IncompleteReadError with the bytes of the batches before it, all arrived and exact."""
    data = os.urandom(5 * BATCH_BYTES)
    tensorstream_redis.put("cut", data, chunk_size=1 << 20)
    uri = tensorstream_redis.uri("cut")
    path = tensorstream.parse_uri(uri).path
    p = tensorstream.get_provider(uri)
    try:
        info = _loop.run_sync(p.stat(path))
        tensorstream_redis.faults.drop_after(BATCH_BYTES + (4 << 20), times=1)
        buf = bytearray(len(data))
        with pytest.raises(IncompleteReadError) as broken:
            _loop.run_sync(p.inner.readinto(path, 0, memoryview(buf), pin=Pin.of(info)))
        got = broken.value.received
        assert got > 0 and got % BATCH_BYTES == 0 and buf[:got] == data[:got]
        assert broken.value.served == Pin(size=len(data), etag=info.etag)
    finally:
        _loop.run_sync(p.close())
