"""Sequential read-ahead for :class:`~tensorstream.file.StreamReader`.

A model loader reads a file front to back: a small header, a large tensor,
another header, and so on. One reader waiting on one request at a time
leaves the network idle between tensors, and splitting only *inside* each
``readinto`` gives few concurrent requests for small tensors. The
prefetcher instead keeps fixed-size *segments* ahead of the read position in
flight, on several connections at once, independent of how the file is cut
into tensors.

* **Two regimes, measured.** Each completed request of a large segment
  measures one connection's rate. On a *fast* link (loopback, an object
  store next door) the reader's CPU is the limit: segments are requested
  late, on a few connections, straight into the caller's buffers (no
  copy). On a *slow* link (paced or far-away object storage) the network is
  the limit: segments are read ahead up to ``window`` on as many connections
  as it takes (up to ``concurrency``), and copied out when read.
* **Late binding.** Planned segments get a buffer only when requested; a
  planned segment that a ``readinto`` covers whole is fetched straight into
  the caller's buffer. :meth:`Prefetcher.set_boundaries` (fed from
  tensorizer's index) cuts segments at tensor boundaries so that they do.
* Segments already received are copied into the caller's buffer with
  ``ctypes.memmove``, which releases the GIL.
* Memory is bounded by ``window`` plus the requests in flight.
* A failed segment raises only if it is read; every request of a read has
  finished (or failed) before that read returns or raises, so nothing ever
  writes into a caller's buffer after the call.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import functools
import logging
import math
import statistics
import threading
import time
from typing import Any

from .. import _loop
from ..layers.stack import PolicyProvider
from ._memcopy import copy_into
from ._prefault import populate
from .streamed import SequentialStream, cpu_bound_since

__all__ = ["Prefetcher"]

log = logging.getLogger("tensorstream.readahead.ranged")

#: Segments smaller than this (tensor headers) are latency, not bandwidth:
#: they are always read ahead and never measured.
_SMALL_SEGMENT = 64 << 10
#: Requests in flight on a fast link, and before the first measurement.
_BASE_ACTIVE = 4
#: One connection delivering at least this is a *fast* link (loopback, an
#: object store next door): the reader's CPU, not the network, is the limit,
#: so segments are fetched late, straight into the caller's buffers, on a few
#: connections. Below it the link may be *slow* (paced, far away): read ahead
#: up to the window on as many connections as it takes to reach ``_GOAL_RATE``.
_FAST_RATE = 200e6
_GOAL_RATE = 2e9
#: Large segments measured per probe, and the aggregate gain that justifies
#: going wide.
_PROBES = 4
_WIDE_GAIN = 1.5
#: A process this busy (CPU seconds per second, all threads) while probing is
#: limited by its own CPU, not the link: a per-connection rate under
#: ``_FAST_RATE`` then says nothing about the network, and more connections
#: and read-ahead copies would only add work. A paced or distant link keeps
#: the reader mostly idle (a 25 MB/s connection costs ~2% of a core).
_BUSY_CPU = 0.6
#: A serial server (Redis) on a fast link: its replies arrive as objects that
#: are copied anyway, so one connection parses them into read-ahead buffers
#: (holding the GIL) while the reader copies into fresh tensor memory and
#: faults its pages in (without it): a two-stage pipeline over two cores.
#: This much is read ahead.
_SERIAL_LEAD = 16 << 20


class _Segment:
    __slots__ = ("buffer", "direct", "end", "error", "event", "launched", "phase", "start",
                 "task")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.buffer: memoryview | None = None  # assigned when launched (or made direct)
        self.direct = False  # the buffer is a slice of a caller's buffer
        self.launched = False
        self.phase = ""  # the probing phase it was requested in
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[Any] | concurrent.futures.Future[Any] | None = None


class Prefetcher:
    """Read-ahead engine of one reader. Call :meth:`readinto` from one thread."""

    def __init__(
        self,
        provider: PolicyProvider,
        path: str,
        size: int,
        etag: str | None,
        *,
        segment: int,
        window: int,
        concurrency: int,
        limit: int | None = None,
    ) -> None:
        self._provider = provider
        self._path = path
        self._size = size
        self._etag = etag
        self._seg = max(1, segment)
        self._window = max(0, window)
        self._limit = size if limit is None else min(size, limit)
        self._max = max(1, concurrency)
        self._active = min(self._max, _BASE_ACTIVE)
        self._in_flight = 0
        self._bounds: list[int] = []
        self._lead = 0  # bytes of large segments planned past a read (fast link: none)
        self._phase = "base"  # base -> (wide) -> settled: see _measure
        self._samples: list[float] = []
        self._base_rate = 0.0
        self._probe_clock: tuple[float, float] | None = None  # (wall, process CPU) at start
        self._direct_bytes = 0
        self._copied_bytes = 0
        self._streams_opened = 0
        self._lock = threading.Lock()
        self._segments: dict[int, _Segment] = {}  # planned or launched, buffered
        self._urgent: collections.deque[_Segment] = collections.deque()  # a read waits
        self._ahead: collections.deque[_Segment] = collections.deque()  # read-ahead
        self._free: list[bytearray] = []
        self._last_end: int | None = None  # None: no read yet (the first read starts a run)
        self._closed = False
        # Providers with a blocking data path (zero-copy, GIL-free receives) are
        # driven from a pool of worker threads instead of the I/O loop. Threads
        # start on demand: about ``active`` of them ever run.
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Providers with range streams start by streaming sequential reads (one
        # request per run of reads); a slow link hands over to ranged read-ahead.
        self._stream: SequentialStream | None = None
        caps = provider.capabilities
        if caps.blocking_reads:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._max, thread_name_prefix="tensorstream-fetch"
            )
        if caps.range_streams and caps.blocking_reads and provider.config.transfer.stream_reads:
            self._stream = SequentialStream(provider, path, size, etag, limit=self._limit,
                                            fast_rate=_FAST_RATE, busy_cpu=_BUSY_CPU,
                                            helper=self._pool)
            self._phase = "stream"

    def stats(self) -> dict[str, Any]:
        """How the reads were served: ``direct_bytes`` received straight into the
        caller's buffers, ``copied_bytes`` out of read-ahead buffers; the link
        ``phase`` (``stream``/``base``/``wide``/``settled``), ``active``
        connections, ``readahead`` bytes planned past each read, and the
        ``streams`` (sequential requests) opened."""
        with self._lock:
            return {"direct_bytes": self._direct_bytes, "copied_bytes": self._copied_bytes,
                    "phase": self._phase, "active": self._active, "readahead": self._lead,
                    "streams": self._streams_opened}

    # -- caller side ------------------------------------------------------------
    def readinto(self, pos: int, view: memoryview) -> None:
        """Fill ``view`` with ``[pos, pos + len(view))`` (the caller checked the bounds)."""
        sequential = self._last_end is None or pos == self._last_end
        stream = self._stream
        if stream is not None:
            got = stream.read(pos, view, sequential=pos == self._last_end,
                              first=self._last_end is None)
            with self._lock:
                self._direct_bytes += got
                self._streams_opened = stream.opened
                if stream.slow_rate is not None:
                    self._leave_stream(stream.slow_rate)
            if got == len(view):
                self._last_end = pos + got
                return
            if stream.broke:  # resume exactly where the body broke, under the retry policy
                self._provider.readinto_blocking(self._path, pos + got, view[got:],
                                                 etag=self._etag)
                with self._lock:
                    self._direct_bytes += len(view) - got
                self._last_end = pos + len(view)
                return
            pos, view = pos + got, view[got:]
        self._read_ranges(pos, view, sequential)

    def _leave_stream(self, rate: float) -> None:
        """A stream measured a slow link: read by parallel ranges from now on,
        wide at once (``rate`` is one connection's), and measure that (under the lock)."""
        assert self._stream is not None
        self._stream.close()
        self._stream = None
        self._base_rate = rate
        self._samples = []
        self._go_wide(rate)

    def _go_wide(self, rate: float) -> None:
        """Read ahead on as many connections as reach ``_GOAL_RATE`` at ``rate``
        per connection, and measure that (under the lock)."""
        self._phase = "wide"
        want = math.ceil(_GOAL_RATE / max(rate, 1.0))
        self._active = max(min(self._max, _BASE_ACTIVE), min(self._max, want))
        self._lead = self._window

    def _read_ranges(self, pos: int, view: memoryview, sequential: bool) -> None:
        end = pos + len(view)
        with self._lock:
            needed = self._plan(pos, end, view)
            if sequential:
                self._plan_ahead(end, {seg.start for seg in needed})
            launch = self._next_launches()
        self._launch(launch)
        if any(seg.direct for seg in needed):
            populate(view)  # fault the pages in while other threads receive into them
        try:
            for seg in needed:
                self._wait(seg)
        finally:
            # Never leave a request writing into the caller's buffer.
            for seg in needed:
                if seg.direct:
                    self._wait(seg)
        errors = [s.error for s in needed if s.error is not None]
        if errors:
            with self._lock:
                for seg in needed:
                    if seg.error is not None and not seg.direct:
                        self._segments.pop(seg.start, None)
            raise errors[0]
        copied = 0
        for seg in needed:
            if not seg.direct:
                assert seg.buffer is not None
                lo, hi = max(pos, seg.start), min(end, seg.end)
                copy_into(view[lo - pos : hi - pos], seg.buffer[lo - seg.start : hi - seg.start])
                copied += hi - lo
        self._last_end = end
        with self._lock:
            self._copied_bytes += copied
            self._direct_bytes += len(view) - copied
            self._evict(pos, end, sequential)

    def close(self) -> None:
        """Cancel outstanding read-ahead and drop its buffers."""
        self._closed = True
        if self._stream is not None:
            self._stream.close()
        with self._lock:
            segments = list(self._segments.values())
            self._segments.clear()
            self._urgent.clear()
            self._ahead.clear()
            self._free.clear()
        tasks = [s.task for s in segments if s.task is not None and not s.task.done()]
        for t in tasks:
            self._cancel(t)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- planning (under the lock) -------------------------------------------------
    def _segment_at(self, p: int) -> tuple[int, int]:
        """The segment holding byte ``p``: the fixed-size grid restarts at every
        boundary (tensor data starts/ends), so a segment never straddles one."""
        b = self._bounds
        i = bisect.bisect_right(b, p) - 1
        base = b[i] if i >= 0 else 0
        nxt = b[i + 1] if i + 1 < len(b) else self._size
        start = base + (p - base) // self._seg * self._seg
        return start, min(start + self._seg, nxt, self._size)

    def _plan(self, pos: int, end: int, view: memoryview) -> list[_Segment]:
        out = []
        p = pos
        while p < end:
            start, seg_end = self._segment_at(p)
            p = seg_end
            inside = pos <= start and seg_end <= end
            seg = self._segments.get(start)
            if seg is not None and seg.end != seg_end:
                seg = None  # planned on another grid (before set_boundaries): ignore it
            if seg is not None and not seg.launched and inside:
                # Planned but not requested yet: fetch it straight into the caller's buffer.
                del self._segments[start]
                self._remove_planned(seg)
                seg = None
            if seg is None:
                seg = _Segment(start, seg_end)
                if inside:
                    seg.buffer, seg.direct = view[start - pos : seg_end - pos], True
                else:
                    self._segments[start] = seg
                self._urgent.append(seg)
            elif not seg.launched:
                self._remove_planned(seg)
                self._urgent.append(seg)
            out.append(seg)
        return out

    def _remove_planned(self, seg: _Segment) -> None:
        for queue in (self._ahead, self._urgent):
            try:
                queue.remove(seg)
                return
            except ValueError:
                continue

    def _plan_ahead(self, end: int, skip: set[int]) -> None:
        """Plan segments after ``end``: at most ``lead`` bytes of large ones (small
        ones, tensor headers, are free) and never past ``window``."""
        stop = min(end + self._window, self._limit)
        p, planned = end, 0
        while p < stop:
            start, seg_end = self._segment_at(p)
            p = seg_end
            if seg_end - start >= _SMALL_SEGMENT:
                if planned >= self._lead:
                    break
                planned += seg_end - start
            if start not in self._segments and start not in skip:
                seg = _Segment(start, seg_end)
                self._segments[start] = seg
                self._ahead.append(seg)

    def set_boundaries(self, offsets: list[int]) -> None:
        """Offsets where segments must be cut (e.g. where each tensor's data
        starts and ends), so that a read of one tensor covers whole segments and
        is received straight into its buffer."""
        with self._lock:
            self._bounds = sorted({o for o in offsets if 0 < o < self._size})
            for start, seg in list(self._segments.items()):
                if not seg.launched:
                    del self._segments[start]
                    self._remove_planned(seg)

    def _next_launches(self) -> list[_Segment]:
        """Segments to request now: urgent ones first, up to ``active`` in flight."""
        out: list[_Segment] = []
        while self._in_flight < self._active and (self._urgent or self._ahead):
            seg = (self._urgent or self._ahead).popleft()
            if seg.buffer is None:
                buf = self._free.pop() if self._free else bytearray(self._seg)
                seg.buffer = memoryview(buf)[: seg.end - seg.start]
            seg.launched = True
            seg.phase = self._phase
            if self._probe_clock is None:
                self._probe_clock = (time.perf_counter(), time.process_time())
            self._in_flight += 1
            out.append(seg)
        return out

    def _evict(self, pos: int, end: int, sequential: bool) -> None:
        lo = end if sequential else pos - self._seg
        hi = end + self._window + self._seg
        for start in list(self._segments):
            seg = self._segments[start]
            if seg.end > lo and start < hi:
                continue
            if not seg.launched:
                del self._segments[start]
                self._remove_planned(seg)
            elif seg.event.is_set():
                del self._segments[start]
                if seg.error is None and len(self._free) * self._seg < self._window:
                    self._free.append(seg.buffer.obj)  # type: ignore[union-attr, arg-type]
            elif seg.end <= lo and seg.task is not None:
                del self._segments[start]
                self._cancel(seg.task)

    # -- adapting the connection count ------------------------------------------------
    def _finished(self, seg: _Segment, seconds: float | None) -> list[_Segment]:
        """Book one finished request; return what to launch next (called with no lock)."""
        with self._lock:
            self._in_flight -= 1
            if seconds is not None and seg.error is None:
                try:
                    self._measure(seg, seconds)
                except Exception:  # pragma: no cover - never stall the queue over a statistic
                    log.debug("read-ahead measurement failed", exc_info=True)
            if self._closed:
                return []
            return self._next_launches()

    def _measure(self, seg: _Segment, seconds: float) -> None:
        """Probe the link, then settle (under the lock).

        1. ``_PROBES`` large segments at the base connection count measure one
           connection's rate. At or above ``_FAST_RATE`` the link is fast: stay.
           So it is when the process was busy (``_BUSY_CPU``) meanwhile: the
           rate was limited by the CPU (a small machine on loopback).
        2. Otherwise go wide (``goal / rate`` connections, read-ahead on) and
           measure again. Keep it only if the aggregate rate grew by half: a
           server that serialises requests (one Redis thread, a throttled
           account) gets no faster with more connections, only busier.
        """
        nbytes = seg.end - seg.start
        if (nbytes < _SMALL_SEGMENT or self._phase in ("settled", "stream")
                or seg.phase != self._phase):
            return
        self._samples.append(nbytes / max(seconds, 1e-6))
        if len(self._samples) < _PROBES:
            return
        rate = statistics.median(self._samples)
        self._samples = []
        if self._phase == "base":
            self._base_rate = rate * self._active
            if rate >= _FAST_RATE or self._cpu_bound():
                self._phase = "settled"
                if self._provider.capabilities.serial_server:
                    self._active, self._lead = 1, min(self._window, _SERIAL_LEAD)
                return
            self._go_wide(rate)
        else:
            self._phase = "settled"
            if rate * self._active < _WIDE_GAIN * self._base_rate:
                self._active, self._lead = min(self._max, _BASE_ACTIVE), 0

    def _cpu_bound(self) -> bool:
        """Whether the process spent at least ``_BUSY_CPU`` of the probe on CPU."""
        if self._probe_clock is None:  # pragma: no cover - set by the first launch
            return False
        return cpu_bound_since(self._probe_clock, _BUSY_CPU)

    # -- I/O side ----------------------------------------------------------------------
    def _launch(self, segments: list[_Segment]) -> None:
        if not segments:
            return
        if self._pool is not None:
            for seg in segments:
                try:
                    future = self._pool.submit(self._fetch_blocking, seg)
                except RuntimeError:  # pool shut down: the reader was closed
                    seg.error = OSError("reader was closed")
                    seg.event.set()
                    continue
                seg.task = future
                future.add_done_callback(functools.partial(self._mark_if_cancelled, seg=seg))
            return
        _loop.get_loop().call_soon_threadsafe(self._start_tasks, segments)

    @staticmethod
    def _cancel(task: asyncio.Task[Any] | concurrent.futures.Future[Any]) -> None:
        if isinstance(task, concurrent.futures.Future):
            task.cancel()  # only a fetch that has not started; a running one finishes
        elif not _loop.is_shut_down():
            _loop.get_loop().call_soon_threadsafe(task.cancel)

    def _fetch_blocking(self, seg: _Segment) -> None:
        started = time.perf_counter()
        elapsed: float | None = None
        try:
            assert seg.buffer is not None
            self._provider.readinto_blocking(self._path, seg.start, seg.buffer, etag=self._etag)
            elapsed = time.perf_counter() - started
        except BaseException as exc:
            seg.error = exc
        finally:
            seg.event.set()
            self._launch(self._finished(seg, elapsed))

    def _mark_if_cancelled(self, future: concurrent.futures.Future[Any], *, seg: _Segment) -> None:
        # A fetch cancelled before it started never runs: release its waiters and its slot.
        if future.cancelled():
            seg.error = OSError("read-ahead was cancelled")
            seg.event.set()
            self._launch(self._finished(seg, None))

    def _start_tasks(self, segments: list[_Segment]) -> None:
        if self._closed:
            for seg in segments:
                seg.error = OSError("reader was closed")
                seg.event.set()
            return
        for seg in segments:
            seg.task = asyncio.ensure_future(self._fetch(seg))

    async def _fetch(self, seg: _Segment) -> None:
        started = time.perf_counter()
        elapsed: float | None = None
        try:
            assert seg.buffer is not None
            await self._provider.readinto(self._path, seg.start, seg.buffer, etag=self._etag)
            elapsed = time.perf_counter() - started
        except asyncio.CancelledError:
            seg.error = OSError("read-ahead was cancelled")
            raise
        except Exception as exc:
            seg.error = exc
        finally:
            seg.event.set()
            launch = self._finished(seg, elapsed)
            if launch:
                self._start_tasks(launch)

    def _wait(self, seg: _Segment) -> None:
        while not seg.event.wait(1.0):
            if _loop.is_shut_down():
                raise RuntimeError("tensorstream's I/O thread has stopped")
