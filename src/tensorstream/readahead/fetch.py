"""The I/O side of the read-ahead engine: segments fetched on worker threads
(providers with a blocking data path; their bodies received by the shared
receiver) or as tasks on the I/O loop, each waking the reader when done.
:class:`Fetching` is the base of :class:`~tensorstream.readahead.ranged.Prefetcher`,
which owns the state these methods use."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from typing import Any

from .. import _loop
from ..errors import TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers._http.connections import current
from ..providers._http.receiver import shared_receiving
from ..providers.base import Pin
from .control import Controller
from .segments import Segment
from .streamed import SequentialStream

__all__ = ["Fetching"]

#: Ranged requests at least this large measure one connection's rate.
MEASURED_SEGMENT = 256 << 10


class Fetching:
    """Fetches segments for a reader (the state is the reader's)."""

    _provider: PolicyProvider
    _path: str
    _pin: Pin | None
    _pool: concurrent.futures.ThreadPoolExecutor | None
    _stream: SequentialStream | None
    _ctl: Controller
    _closed: bool

    def _finished(self, seg: Segment) -> list[Segment]:  # pragma: no cover - the reader's
        raise NotImplementedError

    def _launch(self, segments: list[Segment]) -> None:
        if not segments:
            return
        if self._pool is not None:
            for seg in segments:
                try:
                    future = self._pool.submit(self._fetch_blocking, seg)
                except RuntimeError:  # pool shut down: the reader was closed, or the exit's
                    seg.error = OSError(  # (concurrent.futures refuses work once it began)
                        "reader was closed" if self._closed else
                        _loop.after_main_returned() if _loop.main_thread_returned() else
                        "tensorstream's read-ahead has stopped: the interpreter is exiting")
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

    def _fetch_blocking(self, seg: Segment) -> None:
        # A request that ends frees a connection: this thread, awake already, sends
        # the next one itself (a hand-off to another worker costs a wake-up each).
        nxt: Segment | None = seg
        while nxt is not None:
            seg = nxt
            current.cancel = seg.cancel  # the reader's close stops this request
            try:
                if seg.cancel.cancelled:
                    raise OSError("reader was closed")
                with shared_receiving():
                    if seg.parts is not None:
                        self._fetch_body(seg, seg.parts)
                    else:
                        assert seg.buffer is not None
                        self._fetch_into(seg, seg.buffer)
            except BaseException as exc:
                seg.error = exc
            finally:
                current.cancel = None
                seg.event.set()
                launch = self._finished(seg)
            nxt = launch.pop(0) if launch else None
            self._launch(launch)

    def _fetch_into(self, seg: Segment, buffer: memoryview) -> None:
        if self._stream is not None and seg.end - seg.start >= MEASURED_SEGMENT:
            self._fetch_body(seg, [buffer])
        else:
            self._provider.readinto_blocking(self._path, seg.start, buffer, pin=self._pin)

    def _fetch_body(self, seg: Segment, buffers: list[memoryview]) -> None:
        """One ranged request received into ``buffers`` in turn (back to back, the
        whole segment; several in one receive where the body can scatter). Its
        body is timed apart from its wait for the first byte when it is large
        enough: that is what one connection delivers, the most a stream can. A
        body that breaks is resumed under the retry policy."""
        measured = self._stream is not None and seg.end - seg.start >= MEASURED_SEGMENT
        opened = time.perf_counter()
        body = self._provider.open_range_blocking(self._path, seg.start, seg.end, pin=self._pin)
        started = time.perf_counter()
        if measured:
            self._ctl.note_first_byte(started - opened)
        try:
            scatter = getattr(body, "readinto_parts", None)
            done = 0  # bytes of the buffers before the one being read
            try:
                if len(buffers) > 1 and scatter is not None:
                    scatter(buffers)  # an error counts from the first buffer
                else:
                    for buffer in buffers:
                        body.readinto(buffer)
                        done += len(buffer)
            except TensorstreamError as exc:
                self._resume(seg, buffers, done + int(getattr(exc, "received", 0) or 0))
                return
        finally:
            body.close()
        if measured:
            self._ctl.note_connection((seg.end - seg.start)
                                      / max(time.perf_counter() - started, 1e-6))

    def _resume(self, seg: Segment, buffers: list[memoryview], got: int) -> None:
        """Read what a broken body did not deliver (``got`` bytes landed, from the
        first buffer's start) under the retry policy."""
        at = seg.start
        for buffer in buffers:
            have = min(max(got, 0), len(buffer))
            got -= have
            if have < len(buffer):
                self._provider.readinto_blocking(self._path, at + have, buffer[have:],
                                                 pin=self._pin)
            at += len(buffer)

    def _mark_if_cancelled(self, future: concurrent.futures.Future[Any], *, seg: Segment) -> None:
        # A fetch cancelled before it started never runs: release its waiters and its slot.
        if future.cancelled():
            seg.error = OSError("read-ahead was cancelled")
            seg.event.set()
            self._launch(self._finished(seg))

    def _start_tasks(self, segments: list[Segment]) -> None:
        if self._closed:
            for seg in segments:
                seg.error = OSError("reader was closed")
                seg.event.set()
            return
        for seg in segments:
            seg.task = asyncio.ensure_future(self._fetch(seg))

    async def _fetch(self, seg: Segment) -> None:
        try:
            assert seg.buffer is not None
            await self._provider.readinto(self._path, seg.start, seg.buffer, pin=self._pin)
        except asyncio.CancelledError:
            seg.error = OSError("read-ahead was cancelled")
            raise
        except Exception as exc:
            seg.error = exc
        finally:
            seg.event.set()
            launch = self._finished(seg)
            if launch:
                self._start_tasks(launch)

    def _wait(self, seg: Segment, timeout: float | None = None) -> bool:
        """Wait until ``seg`` is done; with ``timeout``, at most that many seconds
        (then False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            if seg.event.wait(step):
                return True
            if _loop.is_shut_down():
                raise RuntimeError("tensorstream's I/O thread has stopped")
            if deadline is not None and time.monotonic() >= deadline:
                return False
