"""The read-ahead engine's units: the memory budget a load's readers share,
and one segment of the grid (planned, in flight, received)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import threading
from typing import Any

__all__ = ["ReadaheadBudget", "Segment", "address"]


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

    def join(self) -> None:
        with self._lock:
            self.readers += 1

    def leave(self) -> None:
        with self._lock:
            self.readers = max(0, self.readers - 1)

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
    __slots__ = ("bound", "buffer", "direct", "end", "error", "event", "launched", "parts", "start",
                 "task")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.buffer: memoryview | None = None  # assigned when launched (or made direct)
        # ... or, bound to several announced buffers in a row, the slices of them it
        # fills in turn (one request received into each; ``buffer`` stays None)
        self.parts: list[memoryview] | None = None
        self.direct = False  # the buffer is a slice of a caller's buffer
        self.bound = False  # ... one the caller announced (expect): read-ahead into it
        self.launched = False
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[Any] | concurrent.futures.Future[Any] | None = None

    def pieces(self, lo: int, hi: int) -> list[tuple[int, memoryview]]:
        """The memory holding ``[lo, hi)`` (inside the segment, which has its
        memory): ``(offset, view)`` for each buffer it lies in."""
        if self.parts is None:
            assert self.buffer is not None
            return [(lo, self.buffer[lo - self.start : hi - self.start])]
        out, at = [], self.start
        for part in self.parts:
            p_lo, p_hi = max(lo, at), min(hi, at + len(part))
            if p_lo < p_hi:
                out.append((p_lo, part[p_lo - at : p_hi - at]))
            at += len(part)
        return out
