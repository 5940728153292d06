"""Sequential read-ahead for :class:`~tensorstream.file.StreamReader`.

A model loader reads a file front to back: a small header, a tensor, another
header, and so on. How those bytes are best fetched depends on what limits
the load, and that can change while it runs (see :mod:`tensorstream.readahead.control`):

* :attr:`Mode.STREAM`: one request per run of reads, received in place by
  the reader's thread (:mod:`tensorstream.readahead.streamed`): the cheapest per
  byte, for a reader whose CPU is the limit. Large reads are received in
  pieces, so the engine can change its mind inside one large tensor.
* :attr:`Mode.RANGED`: fixed-size *segments* (``part_size``, independent of
  the tensor sizes: many small tensors share one request) kept in flight
  ahead of the read position on ``width`` connections, up to ``window``
  bytes ahead; copied out when read (``ctypes.memmove``, which releases the
  GIL). A planned segment that a waiting read covers whole is fetched
  straight into the caller's buffer (*late binding*), and
  :meth:`Prefetcher.set_boundaries` (fed from tensorizer's index) aligns the
  grid with large tensors so that they are. A caller that knows its buffers
  ahead (a loader that allocates the next tensors before it reads them) hands
  them over with :meth:`Prefetcher.expect`: read-ahead of a segment inside one
  of them is received straight into it (*early binding*) and holds no
  read-ahead memory; so is a segment that several of them cover back to back
  (small tensors sharing a request: its body is received into each in turn).

The :class:`~tensorstream.readahead.control.Controller` watches every interval of the
load (bytes delivered, time the reader waited) and moves between the two and
between widths, so no judgement is final. Memory is bounded by ``window``
plus the requests in flight. A failed segment raises only if it is read;
every request of a read has finished (or failed) before that read returns or
raises, so nothing ever writes into a caller's buffer after the call.

The budget and the segments are in :mod:`.segments`; the grid, planning a
read's segments and those ahead in :mod:`.planning`; requesting planned
segments into memory and dropping those the reader passed in :mod:`.launch`;
the I/O side (worker threads whose bodies the shared receiver takes, or
I/O-loop tasks) in :mod:`.fetch`; the reads of :attr:`Mode.STREAM` in
:mod:`.stream_reads`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import mmap
import sys
import threading
import time
from typing import Any

from ..layers.stack import PolicyProvider
from ..providers.base import BodyStream, Pin
from ._memcopy import copy_into
from ._prefault import populate
from .control import INTERVAL, Controller, Mode
from .fetch import Fetching
from .launch import Launching
from .planning import SMALL_SEGMENT
from .segments import Announced, ReadaheadBudget, Segment, address
from .stream_reads import StreamReads
from .streamed import SequentialStream

__all__ = ["Mode", "Prefetcher", "ReadaheadBudget"]

log = logging.getLogger("tensorstream.readahead")

#: Connections of a reader that reads by ranges on a link not yet measured
#: (and of random-access reads beside a stream).
_BASE_WIDTH = 4
#: A read that waits this long (seconds) for one request says so in the debug log.
_LONG_WAIT = 1.0


def _retire(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    """Shut ``pool`` down without waiting for its fetches, and let it go only once
    its threads have exited: a thread that joins them holds it. (An executor
    freed while its workers were still exiting crashed CPython 3.11 in
    ``PyObject_ClearWeakRefs``: the list of weak references it walked changed
    under it, as the exiting workers dropped theirs.)"""
    pool.shutdown(wait=False, cancel_futures=True)
    if sys.is_finalizing():
        return  # no thread can start now (Python 3.11 waits for it for ever)
    with contextlib.suppress(RuntimeError):  # (3.12: "can't create new thread at shutdown")
        threading.Thread(target=pool.shutdown, name="tensorstream-fetch-retire",
                         daemon=True).start()


class Prefetcher(StreamReads, Launching, Fetching):
    """Read-ahead engine of one reader. Call :meth:`readinto` from one thread."""

    def __init__(
        self,
        provider: PolicyProvider,
        path: str,
        size: int,
        pin: Pin | None,
        *,
        segment: int,
        window: int,
        concurrency: int,
        limit: int | None = None,
        budget: ReadaheadBudget | None = None,
        first: BodyStream | None = None,
    ) -> None:
        self._provider = provider
        self.budget = budget if budget is not None else ReadaheadBudget(window)
        self.budget.join()
        self._held = 0  # bytes of the budget this reader holds
        self._path = path
        self._size = size
        self._pin = pin
        self._seg = max(1, segment)
        # The most bytes past a part that ride in its request (_segment_at).
        self._rider = min(SMALL_SEGMENT, self._seg // 16)
        self._window = max(0, window)
        self._limit = size if limit is None else min(size, limit)
        self._max = max(1, concurrency)
        self._in_flight = 0
        self._bounds: list[int] = []
        self._direct_bytes = 0
        self._copied_bytes = 0
        self._streamed_bytes = 0
        self._peak_in_flight = 0
        self._peak_width = 0
        self._lock = threading.Lock()
        self._segments: dict[int, Segment] = {}  # planned or launched, buffered
        self._urgent: collections.deque[Segment] = collections.deque()  # a read waits
        self._ahead: collections.deque[Segment] = collections.deque()  # read-ahead
        self._free: list[mmap.mmap] = []
        self._dests = Announced()  # buffers the caller will read into (expect)
        self._last_end: int | None = None  # None: no read yet (the first read starts a run)
        self._closed = False
        # Bound segments dropped while their fetch ran (close waits for them).
        self._abandoned: list[Segment] = []
        # Providers with a blocking data path (zero-copy, GIL-free receives) are
        # driven from a pool of worker threads instead of the I/O loop. Threads
        # start on demand: about ``width`` of them ever run.
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stream: SequentialStream | None = None
        caps = provider.capabilities
        # A request spanning several announced buffers is received into each in
        # turn: needs the blocking path's body streams.
        self._scatter = bool(caps.blocking_reads and caps.range_streams)
        if caps.blocking_reads:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._max + 1, thread_name_prefix="tensorstream-fetch"
            )
        can_stream = bool(caps.range_streams and caps.blocking_reads
                          and provider.config.transfer.stream_reads)
        if can_stream:
            self._stream = SequentialStream(provider, path, size, pin, limit=self._limit,
                                            helper=self._pool, first=first)
        elif first is not None:  # opened by ``open`` for a stream this reader cannot use
            first.close()
        # One server thread (Redis) answers every request: start on one
        # connection reading ahead while the reader copies (two stages over two
        # cores); the controller still widens if the reader starves.
        base = 1 if provider.read_hints.serial_server else _BASE_WIDTH
        self._ctl = Controller(can_stream=can_stream, base=base, max_width=self._max,
                               now=time.perf_counter(),
                               fixed_width=base if self._window == 0 and not can_stream else None,
                               name=provider.shown_path(path), part=self._seg,
                               load=self.budget.progress)
        self._stream_fresh = True  # the next streamed read opens a request
        self._first_pieces = 0  # streamed pieces before the first measurement (they grow)
        self._streamed_to: int | None = None  # where the stream's last bytes ended
        self._active = self._ctl.width
        self._lead = 0 if self._ctl.mode is Mode.STREAM else self._window
        self._note_width()

    def stats(self) -> dict[str, Any]:
        """How the reads were served: ``direct_bytes`` received straight into
        the caller's buffers (``streamed_bytes`` of them by the reader's own
        stream), ``copied_bytes`` out of read-ahead buffers; the current
        ``phase`` (:class:`Mode` value: ``stream`` or ``ranged``), ``active``
        connections and ``readahead`` bytes planned past each read; ``peak_active``
        and ``peak_in_flight``; ``readahead_peak``, the most bytes of read-ahead
        buffers held at once by this reader and its forks together, and
        ``readahead_held``, those this reader holds now; ``streams``
        opened; ``changes`` of mode or width and the ``reason`` for the current
        one; ``rate`` and ``peak_rate``, the MB/s delivered to the reader in the
        last and the best measured interval; ``history``, the last decisions as
        ``(mode, width, MB/s, waited share, reason)``."""
        with self._lock:
            return {
                "direct_bytes": self._direct_bytes, "copied_bytes": self._copied_bytes,
                "streamed_bytes": self._streamed_bytes,
                "phase": self._ctl.mode.value, "active": self._active,
                "readahead": self._lead, "peak_active": self._peak_width,
                "peak_in_flight": self._peak_in_flight,
                "streams": self._stream.opened if self._stream is not None else 0,
                "changes": self._ctl.changes, "reason": self._ctl.reason,
                "readahead_peak": self.budget.peak, "readahead_held": self._held,
                "rate": round(self._ctl.last_rate / 1e6, 1),
                "peak_rate": round(self._ctl.peak_rate / 1e6, 1),
                "history": [(h.mode.value, h.width, round(h.rate / 1e6, 1), round(h.waited, 2),
                             h.reason) for h in self._ctl.history],
            }

    # -- caller side ------------------------------------------------------------
    def expect(self, pos: int, view: memoryview) -> None:
        """The caller will read ``[pos, pos + len(view))`` into ``view`` later:
        segments of read-ahead inside it are received there directly, without
        read-ahead memory. ``view`` must stay untouched until that read; ranges
        must not overlap earlier ones still pending."""
        with self._lock:
            self._dests.add(pos, view)

    def readinto(self, pos: int, view: memoryview) -> None:
        """Fill ``view`` with ``[pos, pos + len(view))`` (the caller checked the bounds)."""
        try:
            self._readinto(pos, view)
        finally:
            # The announced memory read is the caller's again: no later request
            # may be received into it. (One that starts before the end -- the part
            # holding the header after a tensor streamed in place -- would write
            # those bytes again after the caller changed them: tensorizer
            # decrypts a tensor in place as soon as it is read.)
            with self._lock:
                self._dests.handed_back(pos, pos + len(view))

    def _readinto(self, pos: int, view: memoryview) -> None:
        self._ctl.begin(time.perf_counter())
        sequential = self._last_end is None or pos == self._last_end
        if self._ctl.mode is Mode.STREAM and self._stream is not None:
            # Read-ahead left from a ranged stretch is used up first.
            held = self._held_until(pos, pos + len(view)) if self._segments else pos
            if held > pos:
                self._stream.count(sequential)
                self._read_ranges(pos, view[: held - pos], sequential, steady=False)
                pos, view = held, view[held - pos :]
                sequential = True
            if len(view):
                got = self._stream_read(pos, view, sequential)
                pos, view = pos + got, view[got:]
        if len(view):
            self._read_ranges(pos, view, sequential)
        self._last_end = pos + len(view)
        self._tick()

    def _held_until(self, pos: int, end: int) -> int:
        """The end of the launched read-ahead covering ``pos`` onwards (``pos``: none)."""
        with self._lock:
            p = pos
            while p < end:
                start, seg_end = self._segment_at(p)
                seg = self._segments.get(start)
                if seg is None or not seg.launched or seg.end != seg_end:
                    break
                p = seg_end
            return min(p, end)

    def _tick(self, *, between_reads: bool = True, keep: frozenset[int] = frozenset()) -> None:
        """Let the controller close its interval; apply a new mode or width.
        Inside a read (``between_reads=False``) nothing is planned ahead: the
        rest of that read is planned by the ranged path, straight into it.
        ``keep``: the starts of segments a read waits for (a switch to the
        stream drops the others not yet requested)."""
        ctl = self._ctl
        before = ctl.mode
        if not ctl.tick(time.perf_counter(), may_stream=not keep):
            return
        if before is Mode.STREAM and ctl.mode is not Mode.STREAM and self._stream is not None:
            self._stream.close()
            self._regrid_at_stream_end()
        if ctl.mode is Mode.STREAM:
            self._stream_fresh = True
        with self._lock:
            self._replan()
            self._active = ctl.width if ctl.mode is Mode.RANGED else _BASE_WIDTH
            self._lead = self._window if ctl.mode is Mode.RANGED else 0
            self._note_width()
            if ctl.mode is Mode.STREAM:  # drop read-ahead not yet requested
                for start, seg in list(self._segments.items()):
                    if not seg.launched and start not in keep:
                        del self._segments[start]
                        self._remove_planned(seg)
                self._drop_spares(keep=2)  # and spare buffers: the stream needs none
            elif between_reads and self._last_end is not None:
                self._plan_ahead(self._last_end, set())
            launch = self._next_launches()
        self._launch(launch)

    def _note_width(self) -> None:
        if self._ctl.mode is Mode.RANGED:
            self._peak_width = max(self._peak_width, self._active)

    def _read_ranges(self, pos: int, view: memoryview, sequential: bool, *,
                     steady: bool = True) -> None:
        end = pos + len(view)
        if sequential and self._copy_received(pos, view, steady):
            return
        with self._lock:
            if self._closed:  # closed by another thread: plan nothing that waits
                raise OSError("reader was closed")
            needed = self._plan(pos, end, view)
            if sequential:
                self._plan_ahead(end, {seg.start for seg in needed})
            launch = self._next_launches()
        self._launch(launch)
        if any(seg.direct for seg in needed):
            populate(view)  # fault the pages in while other threads receive into them
        started = time.perf_counter()
        try:
            told, told_wait = self._wait_needed(needed, pos, end, steady)
        finally:
            # Never leave a request writing into the caller's buffer.
            for seg in needed:
                if seg.direct:
                    self._wait(seg)
        waited = time.perf_counter() - started
        errors = [s.error for s in needed if s.error is not None]
        if errors:
            with self._lock:
                self._replan()
                for seg in needed:
                    if seg.error is None or (seg.direct and not seg.bound):
                        continue
                    if self._segments.get(seg.start) is seg:
                        del self._segments[seg.start]
                        if not seg.bound:
                            self._give(self._seg)
            raise errors[0]
        copied = 0
        for seg in needed:
            if seg.direct and not seg.bound:
                continue
            for at, src in seg.pieces(max(pos, seg.start), min(end, seg.end)):
                dst = view[at - pos : at - pos + len(src)]
                if seg.bound and address(dst) == address(src):
                    continue  # read ahead straight into this very buffer
                copy_into(dst, src)
                copied += len(src)
        self._ctl.observe(len(view) - told, max(0.0, waited - told_wait), steady=steady)
        with self._lock:
            self._copied_bytes += copied
            self._direct_bytes += len(view) - copied
            self._evict(pos, end, sequential)

    def _wait_needed(self, needed: list[Segment], pos: int, end: int,
                     steady: bool) -> tuple[int, float]:
        """Wait for the segments of the read ``[pos, end)``. A read that outlasts
        the controller's interval (one large tensor is one read) tells it, every
        interval, the bytes that landed and the time waited meanwhile, and takes
        its decisions at once: a width chosen as the read began is not kept for
        the whole of it. Returns the bytes and seconds told."""
        def landed() -> int:
            return sum(min(end, s.end) - max(pos, s.start) for s in needed if s.event.is_set())

        keep = frozenset(seg.start for seg in needed)
        told, told_wait = 0, 0.0
        last, before = time.perf_counter(), landed()
        for seg in needed:
            since, told_long = time.perf_counter(), False
            while True:
                done = self._wait(seg, max(0.0, last + INTERVAL - time.perf_counter()))
                now = time.perf_counter()
                if not done and not told_long and now - since >= _LONG_WAIT:
                    told_long = True  # (a stalled request: which one, for --debug)
                    log.debug("read-ahead of %s: a read waits %.1f s for bytes [%d, %d) "
                              "(requested: %s; %d of %d requests in flight)", self._ctl.name,
                              now - since, seg.start, seg.end, seg.launched, self._in_flight,
                              self._active)
                if now - last >= INTERVAL:
                    got = landed()
                    self._ctl.observe(got - before, now - last, steady=steady)
                    told, told_wait = told + got - before, told_wait + now - last
                    last, before = now, got
                    self._tick(between_reads=False, keep=keep)
                if done:
                    break
        return told, told_wait

    def _copy_received(self, pos: int, view: memoryview, steady: bool) -> bool:
        """Serve a read that lies inside one segment already received (tensor
        headers, small tensors: most reads of a wide load) with one copy and no
        planning: the segment stays until the reader moves past it, and only
        this thread evicts. Returns whether it did (never for the read that
        reaches the read-ahead's end: that one evicts, so nothing stays held)."""
        start, seg_end = self._segment_at(pos)
        end = pos + len(view)
        seg = self._segments.get(start)
        if (seg is None or seg.end != seg_end or end > seg_end or end >= self._limit or seg.direct
                or not seg.event.is_set() or seg.error is not None or seg.buffer is None):
            return False
        copy_into(view, seg.buffer[pos - start : end - start])
        self._ctl.observe(len(view), 0.0, steady=steady)
        self._copied_bytes += len(view)  # (statistics: a torn read is harmless)
        return True

    def close(self) -> None:
        """Cancel outstanding read-ahead and drop its buffers."""
        if self._closed:
            return
        if log.isEnabledFor(logging.DEBUG):
            stats = self.stats()
            del stats["history"]
            log.debug("read-ahead of %s done: %s", self._provider.shown_path(self._path), stats)
        self._closed = True
        if self._stream is not None:
            self._stream.close()
        with self._lock:
            # Queued segments too: one received straight into a caller's buffer
            # is queued to be sent without being kept among the segments.
            segments = list({id(seg): seg for seg in [
                *self._segments.values(), *self._abandoned, *self._urgent,
                *self._ahead]}.values())
            self._segments.clear()
            self._abandoned = []
            self._urgent.clear()
            self._ahead.clear()
            self._free.clear()
            self._dests.clear()
            self._give(self._held)  # every buffer is dropped
            # A read waiting on read-ahead that was planned but never sent (no
            # slot came free) would wait for ever: it ends with an error now.
            for seg in segments:
                if not seg.launched and not seg.event.is_set():
                    seg.error = OSError("reader was closed")
                    seg.event.set()
        self.budget.leave()
        tasks = [s.task for s in segments if s.task is not None and not s.task.done()]
        for seg in segments:
            seg.cancel.cancel()
        for t in tasks:
            self._cancel(t)
        if self._pool is not None:
            _retire(self._pool)
        # A fetch still receiving into the caller's memory (an announced buffer)
        # must have stopped before close returns: that memory is the caller's again.
        for seg in segments:
            if seg.launched and (seg.bound or seg.direct):
                with contextlib.suppress(RuntimeError):  # the I/O thread stopped: nothing runs
                    self._wait(seg)
