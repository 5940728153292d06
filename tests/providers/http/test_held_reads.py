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


def test_held_bytes_are_served_at_once_and_exactly(http_server: HTTPTestServer) -> None:
    """Whenever ``held`` says n, a ``read_held`` of n succeeds with the right bytes;
    ordinary reads in between (when it says 0) keep the body exact."""
    pool = range_get.ConnectionPool(range_get.TLSSettings())
    body = range_get.open_range(pool, _put(http_server), 0, len(DATA), {}, None, Timeouts())
    pos = served = 0
    time.sleep(0.1)  # the first bytes arrive
    while pos < len(DATA):
        n = min(body.held(), 256 << 10)
        assert 0 <= n <= len(DATA) - pos
        buf = bytearray(n or min(64 << 10, len(DATA) - pos))
        if n:
            assert body.read_held(memoryview(buf))  # what held() promised is served
            served += 1
        else:
            body.readinto(memoryview(buf))
        assert bytes(buf) == DATA[pos : pos + len(buf)]
        pos += len(buf)
    assert served >= 1
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
