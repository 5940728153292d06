"""StreamReader.expect used in ways its contract warns against or does not
foresee: the bytes every read returns stay exact, and nothing is received into
an announced buffer once the reader is closed."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20
OPTIONS: dict[str, Any] = dict(part_size=256 << 10, readahead=2 * MiB, concurrency=8)


pytestmark = pytest.mark.usefixtures("http_reset")  # well-behaved servers, empty logs


def _put(server: HTTPTestServer, size: int, *, paced: bool = True) -> tuple[str, bytes]:
    key = f"expect-hostile-{os.urandom(4).hex()}"
    data = os.urandom(size)
    server.put(key, data)
    if paced:
        server.faults.key = key
        server.faults.rate_limit = 16 * MiB
    return server.url(key), data


@pytest.mark.parametrize("sequential", [False, True])
def test_nothing_lands_in_announced_buffers_after_close(
        http_server: HTTPTestServer, sequential: bool) -> None:
    url, data = _put(http_server, 8 * MiB)
    bufs = [bytearray(MiB) for _ in range(8)]
    with tensorstream.open(url, sequential=sequential, **OPTIONS) as f:
        f.set_read_boundaries(range(0, 8 * MiB + 1, MiB))
        for i, b in enumerate(bufs):
            f.expect(i * MiB, b)
        first = bytearray(MiB)
        assert f.readinto(first) == MiB
        assert first == data[:MiB]
    for b in bufs:
        b[:] = b"\0" * MiB  # the caller's again
    time.sleep(0.5)
    late = [(i, [j for j in range(0, MiB, 4096) if any(b[j:j + 4096])][:3])
            for i, b in enumerate(bufs) if any(b)]
    assert not late, f"bytes were received into buffers after close: {late}"


@pytest.mark.parametrize("sequential", [False, True])
def test_overlapping_announcements_keep_reads_exact(
        http_server: HTTPTestServer, sequential: bool) -> None:
    url, data = _put(http_server, 6 * MiB)
    with tensorstream.open(url, sequential=sequential, **OPTIONS) as f:
        a, b, c = bytearray(2 * MiB), bytearray(2 * MiB), bytearray(MiB)
        f.expect(MiB, a)
        f.expect(2 * MiB, b)  # overlaps a
        f.expect(2 * MiB + 512, c)  # inside both
        out = bytearray(6 * MiB)
        assert f.readinto(out) == 6 * MiB
        assert out == data


@pytest.mark.parametrize("where", ["past-end", "straddles-end", "negative"])
def test_announcements_outside_the_object_keep_reads_exact(
        http_server: HTTPTestServer, where: str) -> None:
    url, data = _put(http_server, 3 * MiB + 5, paced=False)
    with tensorstream.open(url, sequential=True, **OPTIONS) as f:
        buf = bytearray(MiB)
        offset = {"past-end": 5 * MiB, "straddles-end": 3 * MiB - 100, "negative": -10}[where]
        try:
            f.expect(offset, buf)
        except (ValueError, tensorstream.errors.TensorstreamError):
            pass  # refusing it is fine
        assert f.read() == data
