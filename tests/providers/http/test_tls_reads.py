"""Bodies over TLS: after the first large read a body is read from its TLS
object directly (body_socket.tls_reader), skipping the socket file's layers.
Every byte must be where it belongs, whatever the sizes of the reads around
that switch (bytes the socket file buffered with the headers come first)."""

from __future__ import annotations

import os
import uuid

import pytest

import tensorstream
from tensor_files import random_state, same_bytes, tensorizer_bytes
from tensorstream.providers._http import range_get
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom(3 << 20)


def _put(server: HTTPTestServer, data: bytes) -> str:
    key = f"tls-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, data)
    return server.url(key)


@pytest.mark.parametrize("sizes", [
    [1 << 20, 1 << 20, 1 << 20],  # large reads only
    [7, 300_000, 1, 262_145, 5, 1 << 20, 100, -1],  # the switch between small reads
    [100, 16_384, 16_385, 256 << 10, (256 << 10) + 1, 3, 1 << 20, 999_997],  # record sizes
])
def test_tls_body_reads_land_exactly(https_server: HTTPTestServer, sizes: list[int]) -> None:
    sizes = [n if n >= 0 else len(DATA) - sum(sizes) - 1 for n in sizes]  # -1: the rest
    assert sum(sizes) <= len(DATA)
    url = _put(https_server, DATA)
    pool = range_get.ConnectionPool(range_get.TLSSettings(ca_bundle=str(https_server.ca_bundle_path)))
    from tensorstream.config import Timeouts

    body = range_get.open_range(pool, url, 0, sum(sizes), {}, None, Timeouts())
    pos = 0
    switched = False
    for n in sizes:
        buf = bytearray(n)
        body.readinto(memoryview(buf))
        assert bytes(buf) == DATA[pos:pos + n], (pos, n)
        pos += n
        switched = switched or body._tls_read is not None
    assert switched  # the direct path was taken
    assert pool.idle_count() == 1  # read to its end: the connection is reusable
    again = range_get.open_range(pool, url, 10, 20, {}, None, Timeouts())
    buf = bytearray(10)
    again.readinto(memoryview(buf))
    assert bytes(buf) == DATA[10:20]
    pool.close()


def test_a_model_over_tls_loads_exactly(https_server: HTTPTestServer, tmp_path: object) -> None:
    state = random_state(3, 24, (256, 256))  # 24 x 256 KiB
    url = _put(https_server, tensorizer_bytes(state, tmp_path))
    loaded = tensorstream.deserialize(url, device="cpu", ca_bundle=https_server.ca_bundle_path)
    assert set(loaded) == set(state) and all(same_bytes(loaded[k], state[k]) for k in state)


@pytest.mark.parametrize("first", [1 << 20, (256 << 10) + 1])
def test_tls_body_tail_arriving_late_is_read(https_server: HTTPTestServer, first: int) -> None:
    # A paced body: the reader catches up and waits on the socket for the tail.
    # The wait must never ask the kernel for more bytes than the body still owes
    # (a receive low-water mark left from an earlier read hung it until the timeout).
    size = (1 << 20) + first + (100 << 10)
    url = _put(https_server, DATA[:size])
    https_server.faults.rate_limit = 8 << 20
    pool = range_get.ConnectionPool(range_get.TLSSettings(ca_bundle=str(https_server.ca_bundle_path)))
    from tensorstream.config import Timeouts

    body = range_get.open_range(pool, url, 0, size, {}, None, Timeouts(idle=3.0))
    got = bytearray()
    for n in (first, size - first):
        buf = bytearray(n)
        body.readinto(memoryview(buf))
        got += buf
    assert body._tls_read is not None  # the direct path was taken
    assert bytes(got) == DATA[:size]
    pool.close()
