"""StreamReader.expect: read-ahead lands straight in buffers the caller announced (a loader's
next tensors), holding no read-ahead memory, with bytes exact whatever the caller then does
(reads into another buffer, skips, goes back)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20
PIECE = 1 * MiB


#: A well-behaved http_server, its faults reset before and after each test.
pytestmark = pytest.mark.usefixtures("http_server", "http_reset")


def _paced(server: HTTPTestServer, size: int) -> tuple[str, bytes]:
    key = f"expect-{os.urandom(4).hex()}"
    data = os.urandom(size)
    server.put(key, data)
    server.faults.key = key
    server.faults.rate_limit = 16 * MiB  # per response: read-ahead on many connections pays
    return server.url(key), data


OPTIONS: dict[str, Any] = dict(part_size=256 << 10, readahead=4 * MiB, concurrency=16,
                               stream_reads=False)


def _read_pieces(url: str, size: int, *, expect: bool) -> tuple[list[bytearray], dict[str, Any]]:
    """Read ``size`` bytes as 1 MiB "tensors", announcing each one (window ahead) if asked."""
    bufs = [bytearray(PIECE) for _ in range(size // PIECE)]
    with tensorstream.open(url, **OPTIONS) as f:
        f.set_read_boundaries(range(0, size + 1, PIECE))
        announced = 0
        for i, buf in enumerate(bufs):
            # as a loader allocating ahead would: this one and the read-ahead window after it
            while expect and announced < min(len(bufs), i + 5):
                f.expect(announced * PIECE, bufs[announced])
                announced += 1
            f.seek(i * PIECE)
            assert f.readinto(buf) == PIECE
        stats = f.read_stats()
    return bufs, stats


def test_read_ahead_lands_in_expected_buffers(http_server: HTTPTestServer) -> None:
    url, data = _paced(http_server, 16 * MiB)
    bufs, stats = _read_pieces(url, len(data), expect=True)
    assert b"".join(bufs) == data
    assert stats["peak_in_flight"] > 4, stats  # it did read ahead, on many connections
    assert stats["copied_bytes"] == 0 and stats["direct_bytes"] == len(data), stats
    assert stats["readahead_peak"] == 0, stats  # and held no read-ahead memory for it


def test_without_expect_read_ahead_uses_its_buffers(http_server: HTTPTestServer) -> None:
    # The control of the test above: the same reads, nothing announced.
    url, data = _paced(http_server, 16 * MiB)
    bufs, stats = _read_pieces(url, len(data), expect=False)
    assert b"".join(bufs) == data
    assert stats["copied_bytes"] > 0 and stats["readahead_peak"] > 0, stats


def test_reads_into_other_buffers_skips_and_jumps_stay_exact(http_server: HTTPTestServer) -> None:
    url, data = _paced(http_server, 8 * MiB + 123)
    announced = [bytearray(PIECE) for _ in range(8)]
    with tensorstream.open(url, **OPTIONS) as f:
        f.set_read_boundaries(range(0, len(data), PIECE))
        for j, buf in enumerate(announced):
            f.expect(j * PIECE, buf)
        other = bytearray(PIECE + 100)  # not the announced buffer, and across two of them
        f.seek(PIECE - 50)
        assert f.readinto(other) == len(other)
        assert bytes(other) == data[PIECE - 50 : 2 * PIECE + 50]
        f.seek(5 * PIECE)  # a skip
        assert f.read(PIECE) == data[5 * PIECE : 6 * PIECE]
        f.seek(3 * PIECE)  # back, into the announced buffer
        assert f.readinto(announced[3]) == PIECE
        assert bytes(announced[3]) == data[3 * PIECE : 4 * PIECE]
        f.seek(7 * PIECE)
        assert f.read() == data[7 * PIECE :]


def test_exact_boundaries_keep_stretches_smaller_than_a_part(http_server: HTTPTestServer) -> None:
    # 100 KiB "tensors" with 256 KiB parts: by default neighbours share a request (received
    # into each announced buffer in turn); exact boundaries cut at every one, so each lands
    # in its announced buffer with a request of its own.
    url, data = _paced(http_server, 40 * (100 << 10))
    piece = 100 << 10
    for exact in (True, False):
        bufs = [bytearray(piece) for _ in range(40)]
        with tensorstream.open(url, **OPTIONS) as f:
            f.set_read_boundaries(range(0, len(data) + 1, piece), exact=exact)
            _announce_then_read(f, bufs)
            stats = f.read_stats()
            fork = f.fork()  # forks inherit exactness with the boundaries
            assert fork._exact is exact
            fork.close()
        assert b"".join(bufs) == data
        # either way nothing is copied (test_a_request_spanning_announced_buffers_lands_in_each)
        assert stats["copied_bytes"] == 0 and stats["readahead_peak"] == 0, stats


def test_readahead_end_stops_read_ahead_there(http_server: HTTPTestServer) -> None:
    url, data = _paced(http_server, 8 * MiB)
    key = url.rsplit("/", 1)[1]
    end = 3 * MiB
    with tensorstream.open(url, **OPTIONS) as f:
        f.set_readahead_end(end)
        http_server.clear_log()
        assert f.read(end) == data[:end]
        time.sleep(0.2)  # let anything launched show up in the log
        ranges = [r.headers.get("Range", "") for r in http_server.requests_for(key, "GET")]
        last = max(int(r.split("-")[1]) for r in ranges if "-" in r and r.split("-")[1])
        assert last < end + OPTIONS["part_size"], ranges  # nothing planned past the end
        f.set_readahead_end(None)  # lifted: reads (and read-ahead) past it work
        assert f.read() == data[end:]


SMALL = 96 << 10  # smaller than a request (part_size 256 KiB): several share one


def _announce_then_read(f: Any, bufs: list[bytearray]) -> None:
    """Announce back-to-back buffers of one size from offset 0, then read each into its own."""
    piece = len(bufs[0])
    for i, buf in enumerate(bufs):
        f.expect(i * piece, buf)
    for i, buf in enumerate(bufs):
        f.seek(i * piece)
        assert f.readinto(buf) == piece


def _read_small(url: str, count: int, *, gap: int = 0, fork: bool = False
                ) -> tuple[list[bytearray], dict[str, Any]]:
    """Read ``count`` SMALL "tensors" ``gap`` bytes apart, all announced first (as a
    loader allocating its read-ahead window of tensors ahead does)."""
    bufs = [bytearray(SMALL) for _ in range(count)]
    at = [i * (SMALL + gap) for i in range(count)]
    with tensorstream.open(url, **OPTIONS) as f:
        f.set_read_boundaries([at[0], at[-1] + SMALL])
        r = f.fork() if fork else f
        try:
            for offset, buf in zip(at, bufs, strict=True):
                r.expect(offset, buf)
            for offset, buf in zip(at, bufs, strict=True):
                r.seek(offset)
                assert r.readinto(buf) == SMALL
            stats = r.read_stats()
        finally:
            if fork:
                r.close()
    return bufs, stats


@pytest.mark.parametrize("fork", [False, True])
def test_a_request_spanning_announced_buffers_lands_in_each(http_server: HTTPTestServer,
                                                            fork: bool) -> None:
    url, data = _paced(http_server, 40 * SMALL)
    bufs, stats = _read_small(url, 40, fork=fork)
    assert b"".join(bufs) == data
    assert stats["copied_bytes"] == 0, stats
    assert stats["readahead_peak"] == 0, stats  # no read-ahead buffer at all


def test_a_request_spanning_a_gap_between_announced_buffers_is_buffered(
        http_server: HTTPTestServer) -> None:
    # The control: bytes between two announced buffers (a tensorizer header) have no
    # home, so the requests that cover them are received into read-ahead buffers.
    gap = 1000
    url, data = _paced(http_server, 30 * (SMALL + gap))
    bufs, stats = _read_small(url, 30, gap=gap)
    assert all(bytes(b) == data[i * (SMALL + gap):][:SMALL] for i, b in enumerate(bufs))
    assert stats["copied_bytes"] > 1 * MiB, stats


def test_a_body_cut_inside_a_spanning_request_resumes_into_the_same_buffers(
        http_server: HTTPTestServer) -> None:
    url, data = _paced(http_server, 40 * SMALL)
    http_server.faults.drop_after = SMALL + 5000  # inside a request's second buffer
    http_server.faults.drop_times = 3
    bufs, stats = _read_small(url, 40)
    assert http_server.faults.dropped == 3
    assert b"".join(bufs) == data
    assert stats["copied_bytes"] == 0, stats


def test_a_remainder_smaller_than_a_header_rides_with_the_part_before(
        http_server: HTTPTestServer) -> None:
    # "Tensors" of exactly one part plus a 100-byte tail (the next header): one request
    # each, not a part and a 100-byte request.
    part = OPTIONS["part_size"]
    piece = part + 100
    url, data = _paced(http_server, 12 * piece)
    key = url.rsplit("/", 1)[1]
    bufs = [bytearray(piece) for _ in range(12)]
    with tensorstream.open(url, **OPTIONS) as f:
        f.set_read_boundaries(range(0, len(data) + 1, piece), exact=True)
        http_server.clear_log()
        _announce_then_read(f, bufs)
        stats = f.read_stats()
    assert b"".join(bufs) == data
    assert len(http_server.requests_for(key, "GET")) == 12, stats
    assert stats["copied_bytes"] == 0, stats


def test_bytes_already_read_are_never_received_again_into_their_buffer(
        http_server: HTTPTestServer) -> None:
    """The caller owns what a read returned (tensorizer decrypts it in place at
    once, on another thread). A tensor's data streamed in place, then read-ahead
    turns ranged (a busy machine's reader starved) for the header after it:
    the part holding that header started inside the tensor, in its announced
    buffer, which received those bytes again -- ciphertext over the last 256 KiB
    of a decrypted tensor (``test_inplace``, under load). Ranged read-ahead now
    starts where the stream stopped, in place, and fetches nothing twice."""
    from tensorstream.readahead.control import INTERVAL, Mode

    data_len, tail = 4 * (256 << 10) + 1000, 400  # a tensor, then its tail (the next header)
    key = f"expect-{os.urandom(4).hex()}"
    data = os.urandom(data_len + tail + (256 << 10))
    http_server.put(key, data)
    block = bytearray(data_len + tail)  # the tensor's memory and its tail, as inplace allocates
    with tensorstream.open(http_server.url(key), part_size=256 << 10, readahead=4 * MiB) as f:
        f.set_read_boundaries([0, len(block)])
        f.expect(0, block)
        assert f.readinto(memoryview(block)[:data_len]) == data_len
        prefetch = f._prefetch
        assert f.read_stats()["streamed_bytes"] == data_len  # premise: streamed in place
        block[:data_len] = bytes(data_len)  # the caller's now ("decrypted in place")
        # The controller's own rules turn ranged: the reader waited for most of an interval.
        prefetch._ctl.observe(0, 10 * INTERVAL)
        time.sleep(INTERVAL)
        prefetch._tick()
        assert prefetch._ctl.mode is Mode.RANGED  # premise: the header read is ranged
        header = bytearray(8)
        assert f.readinto(header) == 8
        assert header == data[data_len: data_len + 8]
        time.sleep(0.2)  # (a request still on its way would have landed by now)
    assert block[:data_len] == bytes(data_len)  # untouched since the read returned
    ranged = [r.headers.get("Range", "") for r in http_server.requests_for(key, "GET")][1:]
    starts = [int(r.split("=")[1].split("-")[0]) for r in ranged]
    assert starts and min(starts) >= data_len, ranged  # nothing streamed was fetched again


def test_a_request_planned_on_a_new_grid_is_not_received_into_bytes_already_read(
        http_server: HTTPTestServer) -> None:
    """Whatever puts a request's start before bytes already read (here the
    read boundaries change between two reads), those bytes are not announced
    any more: the request is received into read-ahead memory instead."""
    part = 256 << 10
    key = f"expect-{os.urandom(4).hex()}"
    data = os.urandom(3 * part)
    http_server.put(key, data)
    buf = bytearray(len(data))
    with tensorstream.open(http_server.url(key), part_size=part, readahead=4 * MiB,
                           stream_reads=False) as f:
        f.expect(0, buf)
        first = part + 50_000
        assert f.readinto(memoryview(buf)[:first]) == first
        buf[:first] = bytes(first)  # the caller's now
        f.set_read_boundaries([100_000])  # a part now starts at 100_000, before `first`
        rest = bytearray(8)
        assert f.readinto(rest) == 8
        assert rest == data[first: first + 8]
        time.sleep(0.2)
    assert buf[:first] == bytes(first)  # untouched since the read returned


def test_planning_resumes_where_the_last_read_left_it(http_server: HTTPTestServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read plans read-ahead from where the previous read's planning stopped
    instead of walking the whole window again (on a paced load that walk was the
    reader thread's largest cost in the read engine): the grid is looked up a
    few times per read, not once per segment of the window."""
    from tensorstream.readahead.ranged import Prefetcher

    calls: list[int] = []
    real = Prefetcher._segment_at

    def counted(self: Prefetcher, p: int) -> tuple[int, int]:
        calls.append(1)
        return real(self, p)

    monkeypatch.setattr(Prefetcher, "_segment_at", counted)
    count, piece = 96, 256 << 10
    url, data = _paced(http_server, count * piece)
    bufs = [bytearray(piece) for _ in range(count)]
    with tensorstream.open(url, part_size=piece, readahead=8 * MiB, concurrency=16,
                           stream_reads=False) as f:
        f.set_read_boundaries(range(0, count * piece + 1, piece), exact=True)
        for i, buf in enumerate(bufs):
            f.expect(i * piece, buf)
        calls.clear()
        for buf in bufs:
            assert f.readinto(buf) == piece
    assert b"".join(bufs) == data
    window = 8 * MiB // piece  # segments in the read-ahead window: 32
    assert len(calls) < count * window // 4, (len(calls), count)


def test_announced_read_ahead_reaches_past_the_window(http_server: HTTPTestServer) -> None:
    """Segments received into announced buffers hold no read-ahead memory, so
    they do not count against ``readahead``: on a paced link segments that
    arrived before the reader wanted them would otherwise leave connections
    idle (planning reaches twice the window over announced buffers)."""
    count, piece = 48, 256 << 10
    url, data = _paced(http_server, count * piece)
    bufs = [bytearray(piece) for _ in range(count)]
    window = 2 * MiB  # 8 segments
    with tensorstream.open(url, part_size=piece, readahead=window, concurrency=32,
                           stream_reads=False) as f:
        f.set_read_boundaries(range(0, count * piece + 1, piece), exact=True)
        for i, buf in enumerate(bufs):
            f.expect(i * piece, buf)
        for buf in bufs:
            assert f.readinto(buf) == piece
        stats = f.read_stats()
    assert b"".join(bufs) == data
    # Within the window: the read's own segment and 8 ahead, at most 9 in flight.
    assert stats["peak_in_flight"] > window // piece + 1, stats
    assert stats["readahead_peak"] == 0, stats
