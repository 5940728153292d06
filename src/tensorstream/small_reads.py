"""The small-read buffer of a :class:`~tensorstream.file.StreamReader`.

Reads at most :data:`SMALL_READ` long (tensor headers, small tensors) are served
from a buffer that one read of bytes already arrived fills (:data:`SMALL_FILL`):
a copy each instead of a trip through every layer down to the socket each, which
is what loads of thousands of small tensors spent their time on
(docs/benchmarks.md, "Session 24"). Larger reads go to their memory directly.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .readahead.ranged import Prefetcher

__all__ = ["SMALL_FILL", "SMALL_READ", "SmallReadBuffer"]

#: Reads at most this long are served from the buffer (see the module's docstring).
SMALL_READ = 64 << 10
#: Bytes one fill of that buffer asks for; filled only with bytes that have
#: arrived (never waits), else the read goes its usual way.
SMALL_FILL = 256 << 10


class SmallReadBuffer:
    """Bytes ``[at, end)`` of an object, read ahead of small reads; one reader's,
    used under its lock."""

    def __init__(self) -> None:
        self._buffer: memoryview | None = None
        self.at = self.end = 0

    def take(self, pos: int, view: memoryview, want: int) -> int:
        """Copy what the buffer holds of the ``want`` bytes at ``pos`` into
        ``view`` (from its start); returns how many."""
        buffer = self._buffer
        if buffer is None or not self.at <= pos < self.end:
            return 0
        n = min(want, self.end - pos)
        at = pos - self.at
        view[:n] = buffer[at : at + n]
        return n

    def fill(self, prefetch: Prefetcher, pos: int, want: int, size: int,
             boundaries: Sequence[int]) -> bool:
        """Fill the buffer from ``pos`` with the bytes of the object (``size``
        long) that have arrived already (at most :data:`SMALL_FILL`); False when
        those would be no more than ``want`` (nothing changed then)."""
        n = _fill_end(boundaries, size, pos, min(pos + SMALL_FILL, size)) - pos
        if n <= want:  # (asks nothing of the socket: a header before a large tensor)
            return False
        n = min(n, prefetch.held(pos))
        if n <= want:
            return False
        if self._buffer is None:
            self._buffer = memoryview(bytearray(SMALL_FILL))
        # What it held is gone from here on, whatever happens: a fill cut short
        # (an interrupt) leaves bytes of two stretches in it.
        self.at = self.end = 0
        if not prefetch.read_held(pos, self._buffer[:n]):
            return False
        self.at, self.end = pos, pos + n
        return True

    def release(self) -> None:
        """Drop the buffer's memory (the reader is closed)."""
        self._buffer = None


def _fill_end(bounds: Sequence[int], size: int, pos: int, end: int) -> int:
    """Where a fill of ``[pos, end)`` stops: before the first stretch between two
    read boundaries (``StreamReader.set_read_boundaries``) as long as a fill, a
    large tensor's data, which its own read receives in place (copied from here
    it cost more than the reads a fill saves)."""
    i = bisect.bisect_right(bounds, pos)
    while i < len(bounds) and bounds[i] < end:
        after = bounds[i + 1] if i + 1 < len(bounds) else size
        if after - bounds[i] >= SMALL_FILL:
            return bounds[i]
        i += 1
    return end
