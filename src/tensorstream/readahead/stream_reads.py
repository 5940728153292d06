"""How a reader reads while in :attr:`~.control.Mode.STREAM`: from its own
sequential stream (:class:`~.streamed.SequentialStream`), in pieces sized to the
last measured rate so the controller can change its mind inside one large read,
and small reads (tensor headers) served straight from bytes that have arrived.
When the controller leaves the stream, the segment grid restarts where it
stopped. :class:`StreamReads` is a base of
:class:`~tensorstream.readahead.ranged.Prefetcher`, which owns the state these
methods use."""

from __future__ import annotations

import bisect
import threading
import time
from typing import TYPE_CHECKING

from ..layers.stack import PolicyProvider
from ..providers.base import Pin
from ._clock import busy_seconds
from .control import INTERVAL, Controller, Mode
from .planning import Planning
from .segments import Announced
from .streamed import SequentialStream

__all__ = ["StreamReads"]

#: A streamed read is received in pieces of about one measuring interval of
#: the last delivered rate (within these bounds; before any measurement the
#: smallest, doubling each piece), so the controller can change its mind
#: inside one large read, and early.
_STREAM_PIECE = (256 << 10, 4 << 20)
#: The largest read :meth:`Prefetcher.read_held` serves (tensor headers, small
#: tensors, and :class:`~tensorstream.file.StreamReader`'s fills of its buffer
#: for small reads).
_HELD_READ = 256 << 10


class StreamReads(Planning):
    """The streamed reads of one reader (the state is the reader's)."""

    _provider: PolicyProvider
    _path: str
    _pin: Pin | None
    _stream: SequentialStream | None
    _ctl: Controller
    _lock: threading.Lock
    _dests: Announced
    _last_end: int | None
    _stream_fresh: bool
    _first_pieces: int
    _streamed_to: int | None
    _direct_bytes: int
    _streamed_bytes: int

    if TYPE_CHECKING:
        def _tick(self, *, between_reads: bool = True,
                  keep: frozenset[int] = frozenset()) -> None: ...

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

