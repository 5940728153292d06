"""Sequential read-ahead for :class:`~tensorstream.file.StreamReader`.

A model loader reads a file front to back: a small header, a large tensor,
another header, and so on. One reader waiting on one request at a time
leaves the network idle between tensors, and splitting only *inside* each
``readinto`` gives few concurrent requests for small tensors. The
prefetcher instead keeps a window of fixed-size *segments* ahead of the
read position in flight, on many connections at once, independent of how
the file is cut into tensors.

* Segments already requested are copied into the caller's buffer with
  ``ctypes.memmove``, which releases the GIL, so the copy runs on the
  caller's core while the I/O thread keeps receiving on the other.
* Segments not yet requested that lie wholly inside a large read are
  fetched straight into the caller's buffer (no copy at all).
* A read served from finished segments never waits for the I/O thread.
* Memory is bounded: at most ``window`` bytes of segments are held.
* A failed segment raises only if it is read; every request of a read has
  finished (or failed) before that read returns or raises, so nothing ever
  writes into a caller's buffer after the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import functools
import threading
from typing import Any

from . import _loop
from .policy import PolicyProvider

__all__ = ["Prefetcher"]

_SMALL_COPY = 64 << 10


def copy_into(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` for equal-length byte views, without holding the GIL when large."""
    n = len(src)
    if n < _SMALL_COPY or dst.readonly:
        dst[:n] = src
        return
    d = (ctypes.c_char * n).from_buffer(dst)
    s = (ctypes.c_char * n).from_buffer(src) if not src.readonly else None
    if s is None:  # pragma: no cover - segment buffers are always writable
        dst[:n] = src
        return
    ctypes.memmove(d, s, n)


class _Segment:
    __slots__ = ("buffer", "direct", "end", "error", "event", "scheduled", "start", "task")

    def __init__(self, start: int, end: int, buffer: memoryview, direct: bool) -> None:
        self.start = start
        self.end = end
        self.buffer = buffer
        self.direct = direct
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[Any] | concurrent.futures.Future[Any] | None = None
        self.scheduled = False


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
        self._concurrency = max(1, concurrency)
        self._lock = threading.Lock()
        self._segments: dict[int, _Segment] = {}
        self._free: list[bytearray] = []
        self._last_end: int | None = None  # None: no read yet (the first read starts a run)
        self._sem: asyncio.Semaphore | None = None
        self._closed = False
        # Providers with a blocking data path (zero-copy, GIL-free receives) are
        # driven from a pool of worker threads instead of the I/O loop.
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        if provider.capabilities.blocking_reads:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._concurrency, thread_name_prefix="tensorstream-fetch"
            )

    # -- caller side ------------------------------------------------------------
    def readinto(self, pos: int, view: memoryview) -> None:
        """Fill ``view`` with ``[pos, pos + len(view))`` (the caller checked the bounds)."""
        end = pos + len(view)
        sequential = self._last_end is None or pos == self._last_end
        with self._lock:
            needed = self._plan(pos, end, view)
            launch = [s for s in needed if not s.scheduled]
            if sequential:
                launch += self._plan_ahead(end, {seg.start for seg in needed})
            for seg in launch:
                seg.scheduled = True
        if launch:
            self._launch(launch)
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
        for seg in needed:
            if not seg.direct:
                lo, hi = max(pos, seg.start), min(end, seg.end)
                copy_into(view[lo - pos : hi - pos], seg.buffer[lo - seg.start : hi - seg.start])
        self._last_end = end
        with self._lock:
            self._evict(pos, end, sequential)

    def close(self) -> None:
        """Cancel outstanding read-ahead and drop its buffers."""
        self._closed = True
        with self._lock:
            segments = list(self._segments.values())
            self._segments.clear()
            self._free.clear()
        tasks = [s.task for s in segments if s.task is not None and not s.task.done()]
        for t in tasks:
            self._cancel(t)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- planning (under the lock) -------------------------------------------------
    def _plan(self, pos: int, end: int, view: memoryview) -> list[_Segment]:
        out = []
        first = pos - pos % self._seg
        for start in range(first, end, self._seg):
            seg_end = min(start + self._seg, self._size)
            seg = self._segments.get(start)
            if seg is None:
                if pos <= start and seg_end <= end:
                    # Wholly inside the caller's buffer: fetch straight into it.
                    seg = _Segment(start, seg_end, view[start - pos : seg_end - pos], True)
                else:
                    seg = self._new_segment(start, seg_end)
                    self._segments[start] = seg
            out.append(seg)
        return out

    def _plan_ahead(self, end: int, skip: set[int]) -> list[_Segment]:
        out: list[_Segment] = []
        if self._window < self._seg:
            return out
        first = end - end % self._seg
        stop = min(end + self._window, self._limit)
        for start in range(first, stop, self._seg):
            if start not in self._segments and start not in skip and start < self._size:
                seg = self._new_segment(start, min(start + self._seg, self._size))
                self._segments[start] = seg
                out.append(seg)
        return out

    def _new_segment(self, start: int, end: int) -> _Segment:
        buf = self._free.pop() if self._free else bytearray(self._seg)
        return _Segment(start, end, memoryview(buf)[: end - start], False)

    def _evict(self, pos: int, end: int, sequential: bool) -> None:
        lo = end if sequential else pos - self._seg
        hi = end + self._window + self._seg
        for start in list(self._segments):
            seg = self._segments[start]
            if seg.end <= lo or start >= hi:
                if seg.event.is_set():
                    del self._segments[start]
                    if seg.error is None and len(self._free) * self._seg < self._window:
                        self._free.append(seg.buffer.obj)  # type: ignore[arg-type]
                elif seg.end <= lo and seg.task is not None:
                    del self._segments[start]
                    self._cancel(seg.task)

    # -- I/O thread side -------------------------------------------------------------
    def _launch(self, segments: list[_Segment]) -> None:
        if self._pool is not None:
            for seg in segments:
                try:
                    future = self._pool.submit(self._fetch_blocking, seg)
                except RuntimeError:  # pool shut down: the reader was closed
                    seg.error = OSError("reader was closed")
                    seg.event.set()
                    continue
                seg.task = future
                future.add_done_callback(functools.partial(_mark_if_cancelled, seg=seg))
            return
        _loop.get_loop().call_soon_threadsafe(self._start_tasks, segments)

    @staticmethod
    def _cancel(task: asyncio.Task[Any] | concurrent.futures.Future[Any]) -> None:
        if isinstance(task, concurrent.futures.Future):
            task.cancel()  # only a fetch that has not started; a running one finishes
        elif not _loop.is_shut_down():
            _loop.get_loop().call_soon_threadsafe(task.cancel)

    def _fetch_blocking(self, seg: _Segment) -> None:
        try:
            self._provider.readinto_blocking(self._path, seg.start, seg.buffer, etag=self._etag)
        except BaseException as exc:
            seg.error = exc
        finally:
            seg.event.set()

    def _start_tasks(self, segments: list[_Segment]) -> None:
        if self._closed:
            for seg in segments:
                seg.error = OSError("reader was closed")
                seg.event.set()
            return
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._concurrency)
        for seg in segments:
            seg.task = asyncio.ensure_future(self._fetch(seg))

    async def _fetch(self, seg: _Segment) -> None:
        assert self._sem is not None
        try:
            async with self._sem:
                await self._provider.readinto(self._path, seg.start, seg.buffer, etag=self._etag)
        except asyncio.CancelledError:
            seg.error = OSError("read-ahead was cancelled")
            raise
        except Exception as exc:
            seg.error = exc
        finally:
            seg.event.set()

    def _wait(self, seg: _Segment) -> None:
        while not seg.event.wait(1.0):
            if _loop.is_shut_down():
                raise RuntimeError("tensorstream's I/O thread has stopped")


def _mark_if_cancelled(future: concurrent.futures.Future[Any], seg: _Segment) -> None:
    # A fetch cancelled before it started never runs: release its waiters.
    if future.cancelled():
        seg.error = OSError("read-ahead was cancelled")
        seg.event.set()
