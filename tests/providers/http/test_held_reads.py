"""``RangeBody.held``: how many bytes ``read_held`` could serve now, which is what
a reader's small-read buffer fills with (``tensorstream.file.SMALL_FILL``). It
never promises more than ``read_held`` then serves without waiting, and says 0
where ``read_held`` serves nothing (TLS: the queued bytes are ciphertext)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from tensorstream.config import Timeouts
from tensorstream.providers._http import range_get
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom(2 << 20)


def _put(server: HTTPTestServer) -> str:
    key = f"held-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, DATA)
    return server.url(key)


def _held_after_arrival(body: range_get.RangeBody) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        n = body.held()
        if n > 64 << 10:
            return n
        time.sleep(0.01)
    return body.held()


def test_held_bytes_are_served_at_once_and_exactly(http_server: HTTPTestServer) -> None:
    pool = range_get.ConnectionPool(range_get.TLSSettings())
    body = range_get.open_range(pool, _put(http_server), 0, len(DATA), {}, None, Timeouts())
    pos = 0
    for _ in range(5):
        n = min(_held_after_arrival(body), 256 << 10)
        assert n > 0
        buf = bytearray(n)
        assert body.read_held(memoryview(buf))  # what held() promised is served
        assert bytes(buf) == DATA[pos : pos + n]
        pos += n
    assert body.held() <= len(DATA) - pos
    rest = bytearray(len(DATA) - pos)
    body.readinto(memoryview(rest))
    assert bytes(rest) == DATA[pos:]
    assert body.held() == 0  # the body is read to its end
    pool.close()


def test_a_tls_body_holds_nothing_for_held_reads(https_server: HTTPTestServer) -> None:
    pool = range_get.ConnectionPool(range_get.TLSSettings(ca_bundle=str(https_server.ca_bundle_path)))
    body = range_get.open_range(pool, _put(https_server), 0, len(DATA), {}, None, Timeouts())
    time.sleep(0.2)  # bytes have arrived in the socket (encrypted)
    assert body.held() == 0
    assert not body.read_held(memoryview(bytearray(100)))
    buf = bytearray(len(DATA))
    body.readinto(memoryview(buf))
    assert bytes(buf) == DATA
    pool.close()
