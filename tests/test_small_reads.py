"""A StreamReader's small-read buffer (:mod:`tensorstream.small_reads`): small reads
served from fills of bytes that have arrived, exact whatever the buffer held."""

from __future__ import annotations

import pytest

import tensorstream
from fixtures_http import count_held_reads
from tensorstream.testing.http_server import HTTPTestServer


def test_small_reads_share_fills_of_arrived_bytes(http_server: HTTPTestServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of tensor-header-sized reads go through a few fills of the
    reader's buffer, not a trip down to the socket each, and stay exact."""
    import os

    served = count_held_reads(monkeypatch)
    data = os.urandom((1 << 20) + 333)
    http_server.put("file-api/small-reads.bin", data)
    sizes = [8, 130, 17, 1, 64, 200, 3] * 300
    got = bytearray()
    with tensorstream.open(http_server.url("file-api/small-reads.bin")) as f:
        for n in sizes:
            got += f.read(n)
        rest = f.read()
    assert bytes(got) + rest == data
    assert len(served) < len(sizes) // 10  # without the buffer: one each
    assert sum(served) >= len(got) // 2


def test_the_small_read_buffer_never_waits_for_bytes_not_asked_for(
        http_server: HTTPTestServer) -> None:
    """On a slow link a small read returns once its own bytes are in: a fill
    takes only what has arrived (256 KiB at 100 kB/s would take 2.6 s)."""
    import os
    import time

    data = os.urandom(300_000)
    http_server.put("file-api/slow.bin", data)
    http_server.faults.key = "file-api/slow.bin"
    http_server.faults.rate_limit = 100_000
    with tensorstream.open(http_server.url("file-api/slow.bin")) as f:
        t0 = time.monotonic()
        got = b"".join(f.read(100) for _ in range(50))
        elapsed = time.monotonic() - t0
    assert got == data[:5000]
    assert elapsed < 1.5


def test_reads_across_and_back_into_the_small_read_buffer_are_exact(
        http_server: HTTPTestServer) -> None:
    """Reads that start inside the buffer and end past it, large reads after
    small ones, seeks back into bytes the buffer holds and forward past it,
    peeks: every byte is the object's, whatever the buffer held."""
    import os
    import random

    data = os.urandom((3 << 20) + 4321)
    http_server.put("file-api/mixed-reads.bin", data)
    rng = random.Random(24)
    with tensorstream.open(http_server.url("file-api/mixed-reads.bin")) as f:
        for _ in range(400):
            op = rng.random()
            if op < 0.1:
                f.seek(max(0, f.tell() - rng.randrange(1, 300_000)))
            elif op < 0.15:
                f.seek(rng.randrange(0, len(data) + 10))
            elif op < 0.2:
                pos, n = f.tell(), rng.randrange(1, 5000)
                assert f.peek(n)[:n] == data[pos : pos + n][: len(f.peek(n)[:n])]
                assert f.tell() == pos
            else:
                pos = f.tell()
                n = rng.choice([1, 8, 100, 4096, 65536, 65537, 200_000, 1 << 20])
                buf = bytearray(n)
                k = f.readinto(buf)
                assert k == min(n, max(0, len(data) - pos))
                assert bytes(buf[:k]) == data[pos : pos + k]
                assert f.tell() == pos + k


def test_an_interrupt_inside_a_small_read_fill_leaves_the_reader_usable(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception raised while the small-read buffer is filled (a signal
    handler's) reaches the caller, and the next reads are exact."""
    import os

    from tensorstream.providers._http.range_get import RangeBody

    data = os.urandom(1 << 20)
    http_server.put("file-api/interrupted-fill.bin", data)
    held = RangeBody.read_held
    calls = [0]

    class Interrupted(Exception):
        pass

    def interrupted(self: RangeBody, buffer: memoryview) -> bool:
        calls[0] += 1
        if calls[0] == 3:
            held(self, buffer[: len(buffer) // 2])  # half of it received, then the signal
            raise Interrupted
        return held(self, buffer)

    monkeypatch.setattr(RangeBody, "read_held", interrupted)
    with tensorstream.open(http_server.url("file-api/interrupted-fill.bin")) as f:
        got = bytearray()
        with pytest.raises(Interrupted):
            while len(got) < len(data):
                got += f.read(100)
        pos = f.tell()
        assert pos == len(got) and bytes(got) == data[:pos]
        assert f.read() == data[pos:]


def test_a_fill_stops_before_a_large_tensor_read_in_place(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read boundaries (a loader's tensors) bound the fills: the bytes of a stretch
    as long as a fill (a large tensor's data) are never copied through the buffer."""
    import os

    from tensorstream.file import SMALL_FILL

    served = count_held_reads(monkeypatch)
    data = os.urandom(3 << 20)
    http_server.put("file-api/bounded-fill.bin", data)
    big = (1000, 1000 + 2 * SMALL_FILL)  # a large tensor's data
    with tensorstream.open(http_server.url("file-api/bounded-fill.bin")) as f:
        f.set_read_boundaries([0, *big])
        head = b"".join(f.read(100) for _ in range(10))  # headers before it
        assert served and all(n <= big[0] for n in served)
        buf = bytearray(big[1] - big[0])
        assert f.readinto(buf) == len(buf)
        rest = f.read()
    assert head + bytes(buf) + rest == data
