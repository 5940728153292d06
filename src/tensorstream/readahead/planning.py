"""Where the read-ahead engine's requests fall: the segment grid (restarted at
the caller's boundaries, cut at its limit), the segments of a read, and planning
segments ahead of a reader. :class:`Planning` is a base of
:class:`~tensorstream.readahead.ranged.Prefetcher`, which owns the state these
methods use (under its lock)."""

from __future__ import annotations

import bisect
import collections
import threading

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
    _urgent: collections.deque[Segment]
    _lock: threading.Lock
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

