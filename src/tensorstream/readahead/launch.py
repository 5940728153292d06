"""Which planned segments of the read-ahead are requested now, and into what
memory: the caller's announced buffer, several of them in a row, a spare buffer,
or a new mapping within the shared budget (up to ``active`` requests in
flight, urgent ones first); and which are dropped once the reader has moved
past them, their buffers kept as spares or given back. :class:`Launching` is a
base of :class:`~tensorstream.readahead.ranged.Prefetcher`, which owns the state
these methods use (under its lock)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import mmap
import threading
from typing import TYPE_CHECKING, Any

from .planning import Planning
from .segments import Announced, ReadaheadBudget, Segment

__all__ = ["Launching"]


class Launching(Planning):
    """Requests and drops the segments of one reader (the state is the reader's)."""

    budget: ReadaheadBudget
    _lock: threading.Lock
    _held: int
    _in_flight: int
    _active: int
    _peak_in_flight: int
    _scatter: bool
    _closed: bool
    _urgent: collections.deque[Segment]
    _free: list[mmap.mmap]
    _abandoned: list[Segment]
    _dests: Announced

    if TYPE_CHECKING:
        @staticmethod
        def _cancel(task: asyncio.Task[Any] | concurrent.futures.Future[Any]) -> None: ...

    def _take(self, nbytes: int, *, force: bool) -> bool:
        if not self.budget.take(nbytes, self._held, force=force):
            return False
        self._held += nbytes
        return True

    def _give(self, nbytes: int) -> None:
        nbytes = min(nbytes, self._held)
        self._held -= nbytes
        self.budget.give(nbytes)

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
