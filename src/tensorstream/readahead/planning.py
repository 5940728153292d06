"""Where the read-ahead engine's requests fall: the segment grid, and planning
segments ahead of a reader. :class:`Planning` is a base of
:class:`~tensorstream.readahead.ranged.Prefetcher`, which owns the state these
methods use (under its lock)."""

from __future__ import annotations

import bisect
import collections

from .segments import Announced, Segment

__all__ = ["SMALL_SEGMENT", "Planning"]

#: Segments smaller than this (tensor headers) are latency, not bandwidth:
#: they never count against the read-ahead.
SMALL_SEGMENT = 64 << 10


class Planning:
    """The grid and read-ahead planning of one reader (the state is the reader's)."""

    _bounds: list[int]
    _size: int
    _limit: int
    _seg: int
    _rider: int
    _window: int
    _lead: int
    _dests: Announced
    _segments: dict[int, Segment]
    _ahead: collections.deque[Segment]
    #: (a read's end, where planning after it stopped, the bytes of it that
    #: counted against the lead): see :meth:`_plan_ahead`.
    _frontier: tuple[int, int, int] | None = None

    def _segment_at(self, p: int) -> tuple[int, int]:
        """The segment holding byte ``p``: the fixed-size grid restarts at every
        kept boundary (large tensors' data), so a segment never straddles one."""
        b = self._bounds
        i = bisect.bisect_right(b, p) - 1
        base = b[i] if i >= 0 else 0
        nxt = min(b[i + 1] if i + 1 < len(b) else self._size, self._size)
        if p < self._limit:  # no request crosses where this reader's read-ahead ends
            nxt = min(nxt, self._limit)
        start = base + (p - base) // self._seg * self._seg
        # A remainder of a few headers rides with the segment before it (a tensor
        # of whole parts and its tail: one request fewer each).
        if start > base and nxt - start <= self._rider:
            start -= self._seg
        end = start + self._seg
        return start, nxt if nxt - end <= self._rider else end

    def _plan_ahead(self, end: int, skip: set[int]) -> None:
        """Plan segments after ``end``: at most ``lead`` bytes of large ones that
        need read-ahead buffers, and never past ``reach`` (:meth:`_reach`).

        Small segments (tensor headers) and segments the caller's announced
        buffers cover (:meth:`Prefetcher.expect`: received in place, they hold
        no read-ahead memory) do not count against the lead, and past the
        window planning goes on over announced buffers only: on a paced link
        segments that arrived ahead of the reader wait for it, and were they
        counted, the connections would idle behind them.

        A reader moving on from a read this planned after resumes where that
        planning stopped: walking the whole window again on every read was
        most of the engine's work on a paced load's reader threads (its
        limit). Anything that drops planned segments ahead of the reader, or
        moves the grid, calls :meth:`_replan`."""
        stop = min(end + self._reach(), self._limit)
        p, planned = end, 0
        if self._frontier is not None and self._frontier[0] <= end < self._frontier[1]:
            p = self._frontier[1]  # [end, p) is planned (or was read ahead already)
            planned = min(p - end, self._frontier[2])
        window = end + self._window
        while p < stop:
            start, seg_end = self._segment_at(p)
            if seg_end - start >= SMALL_SEGMENT and not self._dests.covers(start, seg_end):
                if planned >= self._lead or start >= window:
                    break  # (past the window, only over announced buffers)
                planned += seg_end - start
            p = seg_end
            if start not in self._segments and start not in skip:
                seg = Segment(start, seg_end)
                self._segments[start] = seg
                self._ahead.append(seg)
        self._frontier = (end, p, planned)

    def _reach(self) -> int:
        """How far past a read planning may go: the lead, and as far again over
        buffers the caller announced (twice the window in all)."""
        return self._window + self._lead

    def _replan(self) -> None:
        """The next planning walks from the read's end again."""
        self._frontier = None
