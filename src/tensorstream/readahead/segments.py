"""The read-ahead engine's units: the memory budget a load's readers share,
one segment of the grid (planned, in flight, received), and the buffers the
caller announced it will read into."""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import ctypes
import itertools
import threading
from typing import Any

from ..providers._http.connections import Cancel
from .control import LoadProgress

__all__ = ["Announced", "ReadaheadBudget", "Segment", "address"]


class ReadaheadBudget:
    """Bytes of read-ahead buffers that the readers of one open object (a
    reader and its forks) hold together: ``readahead`` bounds the memory of a
    whole load, however many parallel readers it has. Each open reader may
    hold at most an equal share, so the first one to read ahead cannot starve
    the others."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.held = 0
        self.peak = 0
        self.readers = 0
        self._lock = threading.Lock()
        #: The same readers' progress, by which their read-ahead controllers judge.
        self.progress = LoadProgress()

    def join(self) -> None:
        with self._lock:
            self.readers += 1
        self.progress.join()

    def leave(self) -> None:
        with self._lock:
            self.readers = max(0, self.readers - 1)
        self.progress.leave()

    def take(self, nbytes: int, mine: int, *, force: bool = False) -> bool:
        """Reserve ``nbytes`` for a reader already holding ``mine``; ``force``:
        even past the limits (a read waits on it)."""
        with self._lock:
            share = self.limit // max(1, self.readers)
            if not force and (self.held + nbytes > self.limit or mine + nbytes > share):
                return False
            self.held += nbytes
            self.peak = max(self.peak, self.held)
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.held = max(0, self.held - nbytes)


def address(view: memoryview) -> int:
    """Where a writable, non-empty byte view's memory starts."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class Segment:
    __slots__ = (
        "_offsets",
        "bound",
        "buffer",
        "cancel",
        "direct",
        "end",
        "error",
        "event",
        "launched",
        "parts",
        "start",
        "task",
    )

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.buffer: memoryview | None = None  # assigned when launched (or made direct)
        # ... or, bound to several announced buffers in a row, the slices of them it
        # fills in turn (one request received into each; ``buffer`` stays None)
        self.parts: list[memoryview] | None = None
        self._offsets: list[int] | None = None  # where each of ``parts`` starts in the file
        self.direct = False  # the buffer is a slice of a caller's buffer
        self.bound = False  # ... one the caller announced (expect): read-ahead into it
        self.launched = False
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[Any] | concurrent.futures.Future[Any] | None = None
        # Stops the blocking fetch while it runs (its connection is shut down).
        self.cancel = Cancel()

    def pieces(self, lo: int, hi: int) -> list[tuple[int, memoryview]]:
        """The memory holding ``[lo, hi)`` (inside the segment, which has its
        memory): ``(offset, view)`` for each buffer it lies in."""
        if self.parts is None:
            assert self.buffer is not None
            return [(lo, self.buffer[lo - self.start : hi - self.start])]
        parts, offsets = self.parts, self._offsets
        if offsets is None or len(offsets) != len(parts) + 1:
            # (a segment spans tens of small tensors and is read one tensor at a time)
            offsets = self._offsets = list(itertools.accumulate(map(len, parts),
                                                                initial=self.start))
        out = []
        i = max(0, bisect.bisect_right(offsets, lo) - 1)
        while i < len(parts) and offsets[i] < hi:
            at = offsets[i]
            p_lo, p_hi = max(lo, at), min(hi, offsets[i + 1])
            if p_lo < p_hi:
                out.append((p_lo, parts[i][p_lo - at : p_hi - at]))
            i += 1
        return out


class Announced:
    """Buffers the caller will read into (:meth:`Prefetcher.expect`): ``(start,
    end, view)``, sorted, disjoint. Not locked: the prefetcher's lock guards it."""

    def __init__(self) -> None:
        self._items: list[tuple[int, int, memoryview]] = []

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, pos: int, view: memoryview) -> None:
        if not len(view):
            return
        item = (pos, pos + len(view), view)
        if not self._items or self._items[-1][0] < pos:
            self._items.append(item)
        else:
            bisect.insort(self._items, item, key=lambda d: d[0])

    def inside(self, start: int, end: int) -> memoryview | None:
        """The slice of a buffer that ``[start, end)`` lies in whole, if any."""
        i = bisect.bisect_right(self._items, start, key=lambda d: d[0]) - 1
        if i >= 0:
            d_start, d_end, view = self._items[i]
            if start >= d_start and end <= d_end:
                return view[start - d_start : end - d_start]
        return None

    def spanning(self, start: int, end: int) -> list[memoryview] | None:
        """The slices of buffers that ``[start, end)`` covers, if buffers lying
        back to back cover all of it (small tensors sharing a request)."""
        i = bisect.bisect_right(self._items, start, key=lambda d: d[0]) - 1
        parts, at = [], start
        while i >= 0 and at < end and i < len(self._items):
            d_start, d_end, view = self._items[i]
            if not d_start <= at < d_end:
                return None
            hi = min(end, d_end)
            parts.append(view[at - d_start : hi - d_start])
            at, i = hi, i + 1
        return parts if parts and at >= end else None

    def covers(self, start: int, end: int) -> bool:
        """Whether buffers lying back to back cover all of ``[start, end)``."""
        items = self._items
        i = bisect.bisect_right(items, start, key=lambda d: d[0]) - 1
        at = start
        while 0 <= i < len(items) and at < end:
            d_start, d_end, _ = items[i]
            if not d_start <= at < d_end:
                return False
            at, i = d_end, i + 1
        return at >= end

    def handed_back(self, pos: int, end: int) -> None:
        """``[pos, end)`` was read: what of it was announced is the caller's again
        (bytes before ``pos`` not read yet stay announced)."""
        items = self._items
        i = max(0, bisect.bisect_right(items, pos, key=lambda d: d[0]) - 1)
        j, keep = i, []
        while j < len(items) and items[j][0] < end:
            d_start, d_end, view = items[j]
            if d_end <= pos:
                keep.append(items[j])
            else:
                if d_start < pos:
                    keep.append((d_start, pos, view[: pos - d_start]))
                if d_end > end:
                    keep.append((end, d_end, view[end - d_start :]))
            j += 1
        items[i:j] = keep

    def drop_before(self, lo: int) -> None:
        """Forget buffers that end at or before ``lo`` (the reader moved past them)."""
        items = self._items
        if items and items[0][1] <= lo:  # (sorted and disjoint: the ends are sorted too)
            del items[: bisect.bisect_right(items, lo, key=lambda d: d[1])]

    def clear(self) -> None:
        self._items.clear()
