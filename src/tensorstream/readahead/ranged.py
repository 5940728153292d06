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

The budget and the segments are in :mod:`.segments`; the grid and planning
ahead in :mod:`.planning`; the I/O side (worker threads whose bodies the
shared receiver takes, or I/O-loop tasks) in :mod:`.fetch`.
"""

from __future__ import annotations

import bisect
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
from ..uri import redact_text
from ._clock import busy_seconds
from ._memcopy import copy_into
from ._prefault import populate
from .control import INTERVAL, Controller, Mode
from .fetch import Fetching
from .planning import SMALL_SEGMENT, Planning
from .segments import Announced, ReadaheadBudget, Segment, address
from .streamed import SequentialStream

__all__ = ["Mode", "Prefetcher", "ReadaheadBudget"]

log = logging.getLogger("tensorstream.readahead")

#: Connections of a reader that reads by ranges on a link not yet measured
#: (and of random-access reads beside a stream).
_BASE_WIDTH = 4
#: A streamed read is received in pieces of about one measuring interval of
#: the last delivered rate (within these bounds; before any measurement the
#: smallest, doubling each piece), so the controller can change its mind
#: inside one large read, and early.
_STREAM_PIECE = (256 << 10, 4 << 20)
#: A read that waits this long (seconds) for one request says so in the debug log.
_LONG_WAIT = 1.0
#: The largest read :meth:`Prefetcher.read_held` serves (tensor headers, small
#: tensors, and :class:`~tensorstream.file.StreamReader`'s fills of its buffer
#: for small reads).
_HELD_READ = 256 << 10


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


class Prefetcher(Fetching, Planning):
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
                               name=redact_text(path), part=self._seg,
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

    def read_held(self, pos: int, view: memoryview) -> bool:
        """Serve a small sequential read from the reader's own stream if its
        bytes have arrived (tensor headers: two of a tensor's three reads), with
        no planning, no lock unless buffers are announced, and no timing (it
        waited for nothing); ``False``: nothing was read, use :meth:`readinto`."""
        stream = self._stream
        if (stream is None or len(view) > _HELD_READ or pos != self._last_end
                or self._ctl.mode is not Mode.STREAM or self._segments
                or not stream.read_held(pos, view)):
            return False
        n = len(view)
        self._ctl.begin(time.perf_counter())
        self._ctl.observe(n, 0.0)
        self._stream_fresh = False
        self._streamed_to = self._last_end = pos + n
        self._direct_bytes += n  # (statistics: a torn count is harmless, as in _copy_received)
        self._streamed_bytes += n
        if self._dests:
            with self._lock:
                self._dests.handed_back(pos, pos + n)
        self._tick()
        return True

    def held(self, pos: int) -> int:
        """Bytes at ``pos`` that :meth:`read_held` could serve now, as far as the
        stream can tell (0 where it would refuse any)."""
        stream = self._stream
        if (stream is None or pos != self._last_end or self._ctl.mode is not Mode.STREAM
                or self._segments):
            return 0
        return min(_HELD_READ, stream.held(pos))

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

    def _stream_read(self, pos: int, view: memoryview, sequential: bool) -> int:
        """Stream as much of ``view`` as the stream serves, piece by piece,
        measuring how long the reader waited for the link; returns the count."""
        stream = self._stream
        assert stream is not None
        got = 0
        while got < len(view) and self._ctl.mode is Mode.STREAM:
            if self._ctl.last_rate:
                size = int(self._ctl.last_rate * INTERVAL)
            else:  # nothing measured yet: start small, so the first look comes early
                size = _STREAM_PIECE[0] << min(4, self._first_pieces)
                self._first_pieces += 1
            size = max(_STREAM_PIECE[0], min(_STREAM_PIECE[1], size))
            piece = view[got : got + size]
            first, self._stream_fresh = self._stream_fresh, False
            wall, cpu, busy = time.perf_counter(), time.thread_time(), busy_seconds()
            opening = stream.open_seconds
            n = stream.read(pos + got, piece, sequential=sequential or got > 0, first=first)
            if stream.open_seconds > opening:
                self._ctl.note_first_byte(stream.open_seconds - opening)
                self._ctl.exclude(stream.open_seconds - opening)
            wall = time.perf_counter() - wall - (stream.open_seconds - opening)
            if stream.short is not None:
                # Off the CPU (in the run queue too) in proportion to the share of
                # the read that had not arrived: a paced link leaves the socket
                # empty however busy the machine; a fast one fills it while the
                # reader waits for a CPU.
                waited = max(0.0, wall - (time.thread_time() - cpu)) * stream.short
            else:
                # Wall time this thread neither ran nor waited for a CPU.
                waited = max(0.0, wall - (busy_seconds() - busy))
            self._ctl.observe(n, waited)
            got += n
            self._streamed_to = pos + got
            with self._lock:
                self._direct_bytes += n
                self._streamed_bytes += n
            if stream.broke:  # resume exactly where the body broke, under the retry policy
                rest = view[got:]  # (the rest of this read: one request, not one per piece)
                self._provider.readinto_blocking(self._path, pos + got, rest, pin=self._pin)
                got += len(rest)
                self._streamed_to = pos + got
                with self._lock:
                    self._direct_bytes += len(rest)
                continue
            if n < len(piece):
                break  # not a run of reads: ranged requests serve the rest
            self._tick(between_reads=False)
        return got

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

    def _regrid_at_stream_end(self) -> None:
        """Restart the segment grid where the stream stopped: ranged read-ahead
        then starts there, instead of fetching again the bytes before it in the
        segment holding that position (which could not be received in place:
        they are the caller's already)."""
        at, self._streamed_to = self._streamed_to, None
        if at is None or not 0 < at < self._size:
            return
        with self._lock:
            i = bisect.bisect_left(self._bounds, at)
            if i == len(self._bounds) or self._bounds[i] != at:
                self._bounds.insert(i, at)
                self._replan()

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

    def _take(self, nbytes: int, *, force: bool) -> bool:
        if not self.budget.take(nbytes, self._held, force=force):
            return False
        self._held += nbytes
        return True

    def _give(self, nbytes: int) -> None:
        nbytes = min(nbytes, self._held)
        self._held -= nbytes
        self.budget.give(nbytes)

    def close(self) -> None:
        """Cancel outstanding read-ahead and drop its buffers."""
        if self._closed:
            return
        if log.isEnabledFor(logging.DEBUG):
            stats = self.stats()
            del stats["history"]
            log.debug("read-ahead of %s done: %s", redact_text(self._path), stats)
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

    # -- planning (under the lock) -------------------------------------------------
    def _plan(self, pos: int, end: int, view: memoryview) -> list[Segment]:
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
                seg = Segment(start, seg_end)
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

    def _remove_planned(self, seg: Segment) -> None:
        for queue in (self._ahead, self._urgent):
            try:
                queue.remove(seg)
                return
            except ValueError:
                continue

    def set_boundaries(self, offsets: list[int], *, exact: bool = False) -> None:
        """Offsets where the caller's reads start and end (e.g. each tensor's
        data). The segment grid restarts at those that open or close at least
        a segment's worth of bytes, so a large tensor covers whole segments
        (received straight into its buffer when read before they were
        requested), while small tensors and their headers still share one
        request per segment. ``exact``: restart at every offset (the caller
        announces a buffer for each stretch, :meth:`expect`, and a segment
        must not straddle two of them to be received in place)."""
        cuts = sorted({o for o in offsets if 0 < o < self._size})
        edges = [0, *cuts, self._size]
        kept = cuts if exact else [
            o for i, o in enumerate(cuts)
            if edges[i + 1] - edges[i] >= self._seg or edges[i + 2] - o >= self._seg]
        with self._lock:
            self._bounds = kept
            self._replan()
            for start, seg in list(self._segments.items()):
                if not seg.launched:
                    del self._segments[start]
                    self._remove_planned(seg)

    def set_limit(self, end: int | None) -> None:
        """Plan no read-ahead past ``end`` (``None``: the end of the object);
        reads past it still work. Planned segments past it are dropped."""
        with self._lock:
            self._limit = self._size if end is None else max(0, min(self._size, end))
            self._replan()
            for start, seg in list(self._segments.items()):
                if not seg.launched and start >= self._limit:
                    del self._segments[start]
                    self._remove_planned(seg)

    def _next_launches(self) -> list[Segment]:
        """Segments to request now: urgent ones first, up to ``active`` in flight."""
        out: list[Segment] = []
        while self._in_flight < self._active and (self._urgent or self._ahead):
            urgent = bool(self._urgent)
            seg = (self._urgent or self._ahead)[0]
            if seg.buffer is None and seg.parts is None and self._dests:
                # Bound when requested (the caller may announce its buffer after planning).
                dest = self._dests.inside(seg.start, seg.end)
                if dest is not None:  # received in the caller's buffer: no read-ahead memory
                    seg.buffer, seg.direct, seg.bound = dest, True, True
                elif self._scatter:  # several small ones in a row: one request into each
                    seg.parts = self._dests.spanning(seg.start, seg.end)
                    seg.direct = seg.bound = seg.parts is not None
            if seg.buffer is None and seg.parts is None:
                if self._free:
                    buf = self._free.pop()
                elif self._take(self._seg, force=urgent):
                    # Its own mapping: returned to the system when dropped (a malloc'd
                    # buffer of this size stays in the heap, ~30 MiB of RSS on a paced
                    # load), and fresh pages come zeroed without a memset. Private: a
                    # shared anonymous map is shmem, dearer to fault in per page.
                    buf = mmap.mmap(-1, self._seg + self._rider,  # (see _segment_at)
                                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                else:
                    break  # read-ahead memory is spent: wait for the reader to consume
                seg.buffer = memoryview(buf)[: seg.end - seg.start]
            (self._urgent if urgent else self._ahead).popleft()
            seg.launched = True
            self._in_flight += 1
            out.append(seg)
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        return out

    def _evict(self, pos: int, end: int, sequential: bool) -> None:
        lo = end if sequential else pos - self._seg
        hi = end + self._reach() + self._seg
        self._dests.drop_before(lo)
        # Planned up to where the read-ahead ends: no new segment will want a
        # spare buffer, so they go back to the system now, not at close (a load's
        # readers finish their shares while tensorizer still builds tensors).
        planned_out = self._frontier is not None and self._frontier[1] >= self._limit
        if planned_out:
            self._drop_spares(keep=0)
        for start in list(self._segments):
            seg = self._segments[start]
            if seg.end > lo and start < hi:
                continue
            if seg.end > lo:
                self._replan()  # (dropped ahead of the reader: plan it again)
            if seg.bound:  # the caller's memory: nothing to recycle or give back
                if not seg.launched:
                    del self._segments[start]
                    self._remove_planned(seg)
                elif seg.event.is_set():
                    del self._segments[start]
                elif seg.end <= lo and seg.task is not None:
                    del self._segments[start]
                    self._cancel(seg.task)
                    seg.cancel.cancel()  # stop receiving into memory the reader moved past
                    self._abandoned = [a for a in self._abandoned if not a.event.is_set()]
                    self._abandoned.append(seg)
                continue
            if not seg.launched:
                del self._segments[start]
                self._remove_planned(seg)
            elif seg.event.is_set():
                del self._segments[start]
                if (seg.error is None and not planned_out
                        and len(self._free) < max(2, self._active)):
                    self._free.append(seg.buffer.obj)  # type: ignore[union-attr, arg-type]
                else:
                    self._give(self._seg)
            elif seg.end <= lo and seg.task is not None:
                del self._segments[start]
                self._cancel(seg.task)
                self._give(self._seg)  # garbage once the request ends

    def _drop_spares(self, *, keep: int) -> None:
        """Give spare buffers beyond ``keep`` back (under the lock): dropped, each is
        unmapped once nothing refers to it."""
        spare = self._free[keep:]
        del self._free[keep:]
        self._give(len(spare) * self._seg)

    def _finished(self, seg: Segment) -> list[Segment]:
        """Book one finished request; return what to launch next (called with no lock)."""
        with self._lock:
            self._in_flight -= 1
            # Its future's done-callback holds it: a cycle (segment, future, callback)
            # that kept every dropped buffer mapped until a collection, and loads
            # pause the collector (tensorstream._gcpause).
            seg.task = None
            if self._closed:
                return []
            return self._next_launches()
