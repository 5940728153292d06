"""The read-ahead engine against a real HTTP server on loopback, with the
server's per-response pacing and first-byte latency as the link: small
tensors share requests on many connections, a link that slows down or speeds
up mid-load is followed, first-byte latency is hidden by requests in flight,
forks share one memory budget, and bytes are always exact.

Time bounds here are loose on purpose (a loaded 2-core machine): each is a
multiple of what one connection of the paced link would take.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import pytest

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20


#: A well-behaved http_server, its faults reset before and after each test.
pytestmark = pytest.mark.usefixtures("http_server", "http_reset")


def _put(server: HTTPTestServer, size: int) -> tuple[str, bytes]:
    key = f"prefetch-{os.urandom(4).hex()}"
    data = os.urandom(size)
    server.put(key, data)
    return server.url(key), data


def _put_model(server: HTTPTestServer, tmp_path: object, count: int,
               shape: tuple[int, ...]) -> tuple[str, str, dict[str, Any], int]:
    from tensor_files import random_state, tensorizer_bytes

    sd = random_state(7, count, shape)
    data = tensorizer_bytes(sd, tmp_path)
    key = f"prefetch-{os.urandom(4).hex()}"
    server.put(key, data)
    return key, server.url(key), sd, len(data)


def _load(url: str, sd: dict[str, Any], **options: Any) -> tuple[float, dict[str, Any]]:
    """Load every tensor through one reader; return (seconds, read_stats)."""
    import torch

    from tensorstream.tensorizer.hook import StreamTensorDeserializer

    started = time.perf_counter()
    with tensorstream.open(url, **options) as f:
        d = StreamTensorDeserializer(f, device="cpu", num_readers=1)
        loaded = dict(d.items())
        d.close()
        stats = f.read_stats()
    elapsed = time.perf_counter() - started
    assert loaded.keys() == sd.keys()
    for name, tensor in sd.items():
        assert torch.equal(loaded[name], tensor), name
    return elapsed, stats


def test_small_tensors_over_a_paced_link_share_requests_on_many_connections(
        http_server: HTTPTestServer, tmp_path: object) -> None:
    key, url, sd, size = _put_model(http_server, tmp_path, 96, (32, 1024))  # 128 KiB each
    cap = 2 * MiB  # bytes/s of each response: one connection would take ~6 s
    http_server.faults.key, http_server.faults.rate_limit = key, cap
    elapsed, stats = _load(url, sd, part_size=512 << 10, concurrency=16)
    gets = http_server.requests_for(key, "GET")
    assert stats["peak_active"] >= 8 and stats["peak_in_flight"] >= 8, stats
    # Requests independent of tensor sizes: four tensors (and headers) per request.
    assert len(gets) < 96 / 2, len(gets)
    assert elapsed < 0.5 * size / cap, (elapsed, stats)  # at least 2x one connection


def test_read_ahead_bodies_are_received_by_the_one_receiving_thread(
        http_server: HTTPTestServer, tmp_path: object) -> None:
    """Ranged read-ahead hands its bodies to the shared receiver (one epoll
    thread), not to one receiving thread per connection."""
    from tensorstream.providers._http.receiver import receiver

    key, url, sd, _ = _put_model(http_server, tmp_path, 24, (64, 1024))  # 256 KiB each
    http_server.faults.key, http_server.faults.rate_limit = key, 4 * MiB
    before = receiver().wakeups
    _, stats = _load(url, sd, part_size=512 << 10, concurrency=8, stream_reads=False)
    assert stats["phase"] == "ranged" and stats["peak_in_flight"] >= 4, stats
    assert receiver().wakeups > before  # paced bodies: its own thread received them


def test_a_fetch_thread_sends_the_next_request_itself(http_server: HTTPTestServer) -> None:
    """A request that ends frees a connection: the worker that ran it sends the
    next one itself instead of waking another worker (one thread hand-off less
    per request), so far fewer fetches are handed to the pool than requests."""
    url, data = _put(http_server, 8 * MiB)
    # Paced, so the link and not this reader is the limit: requests wait to be sent.
    http_server.faults.key, http_server.faults.rate_limit = url.rsplit("/", 1)[1], 16 * MiB
    with tensorstream.open(url, part_size=256 << 10, readahead=2 * MiB, concurrency=2,
                           stream_reads=False) as f:
        pool = f._prefetch._pool
        handed: list[int] = []
        submit = pool.submit

        def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            handed.append(1)
            return submit(fn, *args, **kwargs)

        pool.submit = counted  # type: ignore[method-assign]
        buf = bytearray(len(data))
        view = memoryview(buf)
        for at in range(0, len(data), 64 << 10):  # a reader of small reads
            assert f.readinto(view[at : at + (64 << 10)]) == 64 << 10
        stats = f.read_stats()
    gets = len(http_server.requests_for(url.rsplit("/", 1)[1], "GET"))
    assert bytes(buf) == data
    assert stats["phase"] == "ranged" and gets >= 32, (gets, stats)
    assert len(handed) <= gets // 4, (len(handed), gets)


def test_first_byte_latency_is_hidden_by_requests_in_flight(
        http_server: HTTPTestServer, tmp_path: object) -> None:
    key, url, sd, size = _put_model(http_server, tmp_path, 48, (64, 1024))  # 256 KiB each
    cap = 4 * MiB
    http_server.faults.key, http_server.faults.rate_limit = key, cap
    http_server.faults.latency = 0.05  # before every answer, as object stores do
    elapsed, stats = _load(url, sd, part_size=512 << 10, concurrency=16)
    requests = len(http_server.requests_for(key, "GET"))
    assert stats["peak_in_flight"] >= 8, stats
    one_connection = size / cap + requests * 0.05  # every request waited in turn
    assert elapsed < 0.5 * one_connection, (elapsed, requests, stats)


def _read_all(f: Any, size: int, at: int | None = None,
              then: Any = None) -> bytes:
    out = bytearray()
    while len(out) < size:
        out += f.read(256 << 10)
        if at is not None and len(out) >= at and then is not None:
            then()
            then = None
    return bytes(out)


def test_a_link_that_slows_down_mid_load_gets_more_connections(
        http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 16 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]

    def slow_down() -> None:
        http_server.faults.rate_limit = 2 * MiB  # also the stream's body in progress

    with tensorstream.open(url, part_size=256 << 10, concurrency=16) as f:
        got = _read_all(f, len(data), at=2 * MiB, then=slow_down)
        stats = f.read_stats()
    assert got == data
    # It started on one stream (a fast link), and went wide once the link slowed.
    assert stats["history"][0][0] == "ranged" and "starved" in stats["history"][0][4], stats
    assert stats["streamed_bytes"] >= 2 * MiB
    assert stats["peak_active"] >= 8, stats


def test_a_link_that_speeds_up_mid_load_is_followed(http_server: HTTPTestServer) -> None:
    # Large enough that the fast part spans several of the controller's measuring intervals.
    url, data = _put(http_server, 96 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.rate_limit = 1 * MiB

    def speed_up() -> None:
        http_server.faults.rate_limit = None

    with tensorstream.open(url, part_size=256 << 10, concurrency=8) as f:
        got = _read_all(f, len(data), at=3 * MiB, then=speed_up)
        stats = f.read_stats()
    assert got == data
    # Wide while slow; once the link sped up, the delivered rate followed it
    # past what the slow link allowed on every connection the reader had.
    assert stats["peak_active"] >= 8, stats
    assert stats["peak_rate"] > 2 * 8 * MiB / 1e6, stats


def test_forks_share_one_read_ahead_budget(http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 12 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.rate_limit = 4 * MiB
    part, budget = 256 << 10, 2 * MiB
    out: dict[int, bytes] = {}
    with tensorstream.open(url, part_size=part, concurrency=16, readahead=budget) as f:
        forks = [f.fork(end=(i + 1) * 6 * MiB) for i in range(2)]

        def read(i: int) -> None:
            forks[i].seek(i * 6 * MiB)
            out[i] = forks[i].read(6 * MiB)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = [fork.read_stats() for fork in forks]
        for fork in forks:
            fork.close()
    assert out[0] + out[1] == data
    assert max(s["peak_active"] for s in stats) >= 8, stats
    # Beyond the budget only the partial pieces a read waits on (two per read).
    assert stats[0]["readahead_peak"] <= budget + 2 * 2 * part, stats


def test_read_ahead_memory_goes_back_to_the_system_once_a_reader_reached_its_end(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load's reader finishes its share while tensorizer still builds tensors
    (with the collector paused): its read-ahead buffers are unmapped then, not
    when the load closes it (they were ~40 MiB of a paced load's peak RSS)."""
    import gc
    import mmap
    import types
    import weakref

    from tensorstream.readahead import launch

    live: dict[int, int] = {}
    made: list[int] = []

    def tracked(*args: Any, **kwargs: Any) -> mmap.mmap:
        """The read-ahead's own mappings, counted while alive (a subclass of
        mmap.mmap crashes in its deallocation on Python 3.11)."""
        region = mmap.mmap(*args, **kwargs)
        key = id(region)
        live[key] = len(region)
        made.append(len(region))
        weakref.finalize(region, live.pop, key, None)
        return region

    monkeypatch.setattr(launch, "mmap", types.SimpleNamespace(
        mmap=tracked, MAP_PRIVATE=mmap.MAP_PRIVATE, MAP_ANONYMOUS=mmap.MAP_ANONYMOUS))
    url, data = _put(http_server, 12 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.rate_limit = 4 * MiB  # wide: many buffers in flight
    enabled = gc.isenabled()
    gc.disable()  # as during a load (tensorstream._gcpause)
    try:
        with tensorstream.open(url, part_size=256 << 10, concurrency=16,
                               stream_reads=False) as f:
            fork = f.fork(end=8 * MiB)
            fork.seek(2 * MiB)
            got = _read_all(fork, 6 * MiB)
            stats = fork.read_stats()
            # (a fetch thread lets its segment go just after handing it over)
            deadline = time.monotonic() + 2
            while sum(live.values()) and time.monotonic() < deadline:
                time.sleep(0.01)
            held = sum(live.values())
            fork.close()
    finally:
        if enabled:
            gc.enable()
    assert got == data[2 * MiB: 8 * MiB]
    assert made, "the read-ahead's mappings were not tracked (mmap patched in the wrong module?)"
    assert stats["readahead_peak"] >= 4 * (256 << 10), stats  # it did read ahead
    assert stats["readahead_held"] == 0, stats
    assert held == 0, f"{held} bytes of read-ahead still mapped after the last read"


def test_a_retired_fetch_pool_is_freed_only_after_its_threads_exit() -> None:
    """Freed while its workers were still exiting, an executor crashed CPython
    3.11 (the weak references it walked changed under it): a closed reader's
    pool is held until every one of its threads has ended."""
    import concurrent.futures
    import gc
    import weakref

    from tensorstream.readahead.ranged import _retire

    release = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    busy = pool.submit(release.wait)  # a fetch still running when the reader closes
    workers = list(pool._threads)
    freed: list[list[bool]] = []
    weakref.finalize(pool, lambda: freed.append([t.is_alive() for t in workers]))
    try:
        _retire(pool)
        del pool
        gc.collect()
        assert not freed  # held while its worker runs
    finally:
        release.set()
    assert busy.result(timeout=10) is True
    deadline = time.monotonic() + 10
    while not freed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert freed == [[False] * len(workers)]


def test_closing_a_reader_ends_its_fetch_threads_while_the_reader_is_still_held(
        http_server: HTTPTestServer) -> None:
    """``close`` retires the reader's pool of fetch threads (``_retire``): they
    end at once, not when the reader is garbage-collected (a reader kept in a
    list or a traceback held its idle threads for the life of the process)."""
    url, data = _put(http_server, 4 * MiB)
    f = tensorstream.open(url, part_size=256 << 10, concurrency=8, stream_reads=False)
    try:
        assert f.read(2 * MiB) == data[: 2 * MiB]
        pool = f._prefetch._pool
        assert pool is not None
        workers = list(pool._threads)
        assert workers  # the reads ran on them
    finally:
        f.close()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in workers if t.is_alive()]
    assert f.closed  # (still held here, on purpose)


def test_a_remote_reader_left_open_does_not_hold_up_the_interpreters_exit(
        http_server: HTTPTestServer) -> None:
    """Closed by its finaliser while the interpreter ends, a reader cannot start
    the thread that retires its fetch pool (Python 3.11 waited for it for ever)."""
    import subprocess
    import sys

    url, _ = _put(http_server, 2 * MiB)
    code = ("import sys, tensorstream\n"
            "f = tensorstream.open(sys.argv[1], part_size=256 << 10, stream_reads=False)\n"
            "f.read(1 << 20)\n"
            "print('done', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr


def test_without_read_ahead_reads_at_boundaries_land_straight_in_the_callers_buffer(
        http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 12 * MiB + 300)
    # A tensorizer-like layout: a 100-byte header, 6 MiB of data, a header, the rest.
    bounds = [0, 100, 100 + 6 * MiB, 200 + 6 * MiB, len(data)]
    with tensorstream.open(url, part_size=1 * MiB, stream_reads=False, readahead=0) as f:
        f.set_read_boundaries(bounds)
        out = []
        for lo, hi in itertools.pairwise(bounds):
            buf = bytearray(hi - lo)
            assert f.readinto(buf) == len(buf)
            out.append(bytes(buf))
        stats = f.read_stats()
    assert b"".join(out) == data
    assert stats["phase"] == "ranged" and stats["readahead"] == 0
    # Everything but the small headers was received straight into the buffers.
    assert stats["direct_bytes"] >= len(data) - 300
    assert stats["copied_bytes"] <= 300


def test_without_boundaries_unaligned_reads_are_still_exact(http_server: HTTPTestServer) -> None:
    url, data = _put(http_server, 5 * MiB + 7)
    with tensorstream.open(url, part_size=1 * MiB) as f:
        got = [f.read(n) for n in (3, MiB + 11, 2 * MiB, 10 * MiB)]
    assert b"".join(got) == data


@pytest.mark.parametrize("stream_reads", [True, False])
def test_unaligned_reads_over_a_paced_link_are_exact(http_server: HTTPTestServer,
                                                      stream_reads: bool) -> None:
    url, data = _put(http_server, 6 * MiB + 5)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.rate_limit = 8 * MiB
    sizes = itertools.cycle([1, 100, 70_000, 300_001, 1 << 20, 17])
    with tensorstream.open(url, part_size=128 << 10, concurrency=8,
                           stream_reads=stream_reads) as f:
        out = bytearray()
        while chunk := f.read(next(sizes)):
            out += chunk
            if len(out) > 3 * MiB and f.tell() == len(out):
                f.seek(len(out))  # a no-op seek keeps the run sequential
    assert bytes(out) == data


def test_one_tensorizer_reader_also_cuts_requests_at_tensors(
        http_server: HTTPTestServer, tmp_path: object) -> None:
    """With ``num_readers=1`` tensorizer never asks to reopen the stream; the
    tensor boundaries still reach the read-ahead, so tensor data is received
    straight into the tensors (only headers and tails are copied)."""
    _, url, sd, size = _put_model(http_server, tmp_path, 4, (1024, 512))
    _, stats = _load(url, sd, part_size=1 * MiB, stream_reads=False, readahead=0)
    assert stats["direct_bytes"] > 0.9 * size, stats


def _one_read(url: str, size: int, **options: Any) -> tuple[bytes, float, dict[str, Any]]:
    """Read the whole object with one ``readinto``; return (bytes, seconds, read_stats)."""
    with tensorstream.open(url, **options) as f:
        buf = bytearray(size)
        started = time.perf_counter()
        assert f.readinto(buf) == size
        elapsed = time.perf_counter() - started
        stats = f.read_stats()
    return bytes(buf), elapsed, stats


def test_one_large_read_changes_course_inside_itself(http_server: HTTPTestServer) -> None:
    """A multi-GiB tensor is one read: a slow link is noticed inside it, and
    the rest of it is fetched by parallel ranges straight into the caller's
    buffer (no copy)."""
    url, data = _put(http_server, 12 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.rate_limit = 2 * MiB  # one connection would take 6 s
    got, elapsed, stats = _one_read(url, len(data), part_size=256 << 10, concurrency=16)
    assert got == data
    assert stats["phase"] == "ranged" and stats["peak_active"] >= 8, stats
    assert 0 < stats["streamed_bytes"] < len(data)
    assert stats["direct_bytes"] == len(data) and stats["copied_bytes"] == 0, stats
    assert elapsed < 0.5 * len(data) / (2 * MiB), (elapsed, stats)


def test_a_ranged_read_keeps_widening_inside_itself(http_server: HTTPTestServer) -> None:
    """One large read that starts ranged at a narrow width is not held to it:
    the controller looks every interval while the read waits, and widens the
    rest of that same read (a one-tensor model is one read, and the first
    look's width was kept for all of it: 5 connections on a paced link)."""
    url, data = _put(http_server, 24 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.rate_limit = 1 * MiB  # per response: 4 connections would take 6 s
    got, elapsed, stats = _one_read(url, len(data), part_size=256 << 10, concurrency=16,
                                    stream_reads=False)
    assert got == data
    assert stats["phase"] == "ranged" and stats["peak_in_flight"] >= 8, stats
    assert stats["direct_bytes"] == len(data) and stats["copied_bytes"] == 0, stats
    assert elapsed < 0.6 * len(data) / (4 * MiB), (elapsed, stats)


def test_a_read_stalled_on_a_request_says_which_in_the_debug_log(
        http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    url, data = _put(http_server, 2 * MiB)
    http_server.faults.key = url.rsplit("/", 1)[1]
    http_server.faults.latency = 1.3  # every request's answer
    caplog.set_level("DEBUG", logger="tensorstream.readahead")
    with tensorstream.open(url, part_size=1 * MiB, concurrency=4, stream_reads=False) as f:
        buf = bytearray(len(data))
        assert f.readinto(buf) == len(data)
    assert bytes(buf) == data
    stalls = [r.getMessage() for r in caplog.records if "a read waits" in r.getMessage()]
    assert stalls and "for bytes [0, " in stalls[0], caplog.text
