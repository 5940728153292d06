"""Synchronous file objects over async providers.

:class:`StreamReader` is the seekable binary file that
``tensorizer.TensorDeserializer`` consumes. Sequential reads are fed by the
read-ahead engine (:mod:`tensorstream.readahead`): one streamed request
received in place, or a bounded window of ranged requests in flight on as
many connections as the link needs, switched while the load runs. Every read is
pinned to the ETag seen at open, so a replaced object raises
:class:`~tensorstream.errors.ObjectChangedError` instead of mixing versions.

:class:`StreamWriter` (in :mod:`tensorstream.stream_writer`, re-exported
here) is an atomic, sequential writer: the object appears when the file is
closed normally and never when it is closed after an error, or
garbage-collected without ``close()``.

A reader's small-read buffer is in :mod:`tensorstream.small_reads`, its random
access (:meth:`StreamReader.read_ranges`) in :mod:`tensorstream.range_reads`,
its ``io`` surface (``seek``, ``read``, ``read1``, ``peek``...) in
:mod:`tensorstream.readonly_file`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import _loop
from .layers import timeout as _timeout
from .layers.stack import PolicyProvider
from .providers.base import BodyStream, Capabilities, ObjectInfo, Pin, ReadHints
from .range_reads import as_byte_view as _as_byte_view
from .range_reads import read_ranges as _read_ranges
from .readahead.ranged import Prefetcher, ReadaheadBudget
from .readonly_file import READ1_DEFAULT as READ1_DEFAULT  # (its old home)
from .readonly_file import ReadOnlyFile, byte_position
from .small_reads import SMALL_FILL as SMALL_FILL  # (its old home: tests and docs name it here)
from .small_reads import SMALL_READ, SmallReadBuffer
from .stream_writer import StreamWriter
from .uri import ParsedURI

__all__ = ["StreamReader", "StreamWriter"]

log = logging.getLogger("tensorstream.file")


class _Family:
    """A reader and its forks (:meth:`StreamReader.fork`), which share its provider:
    closed with the last of them to close, whichever that is (closed with the first
    reader, a fork reading on opened connections of its own that nothing closed)."""

    def __init__(self, owns_provider: bool) -> None:
        self.owns_provider = owns_provider
        self.lock = threading.Lock()
        self._open: set[object] = set()

    def join(self) -> object:
        """A reader opened: the token its :meth:`leave` gives back."""
        token = object()
        with self.lock:
            self._open.add(token)
        return token

    def leave(self, token: object) -> bool:
        """A reader closed; True when it was the last one open (once: two threads
        closing one reader at once leave once)."""
        with self.lock:
            if token not in self._open:
                return False
            self._open.discard(token)
            return not self._open


def _adopt_open_readers() -> None:
    """In a forked child: every reader open at the fork becomes the child's own."""
    budgets: dict[int, ReadaheadBudget] = {}
    for reader in list(_open_readers):
        reader._adopt(budgets)


class StreamReader(ReadOnlyFile):
    """Seekable, read-only binary file over a provider.

    Threads may share one reader: reads, seeks and read-ahead hints take turns
    (each read returns the bytes at the position it moved past), which is what
    a plain file gives; a thread per reader (:meth:`fork`) reads in parallel.

    Create with :func:`tensorstream.open`. ``fork()`` returns an independent
    reader of the same object version (shared connection pool), which is how
    parallel readers are fed.

    After ``os.fork()`` (``multiprocessing``'s fork start method) a reader the
    parent had open reads in the child too, from where the parent was, on
    connections of the child's own; the parent's reads are untouched. Closing
    it in the child leaves the parent's connections alone.
    """

    def __init__(
        self,
        provider: PolicyProvider,
        uri: ParsedURI,
        info: ObjectInfo,
        *,
        owns_provider: bool = True,
        on_close: Callable[[], None] | None = None,
        limit: int | None = None,
        budget: ReadaheadBudget | None = None,
        first: BodyStream | None = None,
        family: _Family | None = None,
    ) -> None:
        super().__init__()
        self._provider = provider
        self._uri = uri
        self._info = info
        self._pos = 0
        self._family = family if family is not None else _Family(owns_provider)
        self._forks = 0
        self._fork_lock = threading.Lock()
        # The position and the read-ahead engine are one thread's at a time.
        self._lock = threading.RLock()
        self._on_close = on_close
        self._pid = os.getpid()  # the process that opened it (see _adopt)
        self._limit = limit
        self._boundaries: list[int] = []
        self._exact = False  # every boundary kept (set_read_boundaries)
        # Local files: read in the caller's thread, straight into its buffer.
        self._inline = provider.read_hints.inline
        # Inline reads in progress: close waits for them (it closes their descriptors).
        self._reads = 0
        self._reads_done = threading.Condition(threading.Lock())
        self._closing = False
        self._pin = Pin.of(info)
        # Bytes of the object read ahead of small reads (:mod:`tensorstream.small_reads`).
        self._small = SmallReadBuffer()
        self._prefetch = self._new_prefetcher(budget, first)
        self._member = self._family.join()  # (last: a reader whose making failed is none)
        _open_readers.add(self)

    def _new_prefetcher(self, budget: ReadaheadBudget | None,
                        first: BodyStream | None = None) -> Prefetcher:
        cfg = self._provider.config.transfer
        return Prefetcher(
            self._provider,
            self._uri.path,
            self._info.size,
            self._pin,
            segment=cfg.part_size,
            window=cfg.readahead,
            concurrency=cfg.concurrency,
            limit=self._limit,
            budget=budget,
            first=first,
        )

    def _adopt(self, budgets: dict[int, ReadaheadBudget]) -> None:
        """Make this reader the forked child's own (called in the child, by
        ``os.register_at_fork``; ``budgets``: fresh read-ahead budgets by the
        parent's, so forks of one reader still share one).

        The read-ahead left by the parent is dropped unused, never closed: its
        stream's socket is the parent's too (a read here took the parent's bytes,
        so the parent then read bytes of another offset as its own), its
        requests in flight will never finish here (their threads are the
        parent's: a read waiting for one hung) and its pool believes it has
        idle workers. A fresh one reads from the position the parent had
        reached, over the provider's connections of this process (its pools
        start afresh after a fork); the bytes of the small-read buffer are
        still the object's and are kept. Locks another thread of the parent
        held at the fork would never be released here: they are new too."""
        self._lock = threading.RLock()
        self._fork_lock = threading.Lock()
        self._reads_done = threading.Condition(threading.Lock())
        self._reads = 0
        self._family.lock = threading.Lock()
        if self.closed:
            return
        old = self._prefetch.budget
        budget = budgets.get(id(old))
        if budget is None:
            budget = budgets[id(old)] = ReadaheadBudget(old.limit)
        self._prefetch = self._new_prefetcher(budget)
        if self._boundaries:
            self._prefetch.set_boundaries(self._boundaries, exact=self._exact)

    # -- identity -------------------------------------------------------------
    @property
    def name(self) -> str:
        """The redacted URI."""
        return self._uri.redacted()

    @property
    def size(self) -> int:
        return self._info.size

    @property
    def etag(self) -> str | None:
        return self._info.etag

    @property
    def info(self) -> ObjectInfo:
        return self._info

    @property
    def capabilities(self) -> Capabilities:
        """What the underlying provider can do."""
        return self._provider.capabilities

    @property
    def read_hints(self) -> ReadHints:
        """How the underlying provider is best read (e.g. ``inline`` for local files)."""
        return self._provider.read_hints

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pos={self._pos}"
        return f"<tensorstream.StreamReader {self.name!r} size={self.size} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError("StreamReader cannot be pickled; pass the URI and reopen it instead")

    def _readinto(self, b: Any) -> int:
        self._check_closed()
        view = _as_byte_view(b)
        want = min(len(view), max(0, self._info.size - self._pos))
        if want <= 0:
            return 0
        if _loop.in_loop_thread() and not self._inline:
            raise RuntimeError(
                "StreamReader.readinto was called from tensorstream's own I/O thread; "
                "use the async provider API there"
            )
        start = self._pos
        done = self._from_small(view, want)
        if done == want:
            return want
        view, rest = view[done:], want - done
        try:
            if not self._inline:
                if rest <= SMALL_READ and self._small.fill(self._prefetch, self._pos, rest,
                                                           self._info.size, self._boundaries):
                    return done + self._from_small(view, rest)
                if self._prefetch.read_held(self._pos, view[:rest]):
                    self._pos += rest  # arrived already: no wait, so no deadline to set
                    return want
            with _timeout.operation(self._provider.config.timeouts):  # one read, one deadline
                if self._inline:
                    with self._reading():
                        self._provider.readinto_blocking(self._uri.path, self._pos, view[:rest],
                                                         pin=self._pin)
                else:
                    self._prefetch.readinto(self._pos, view[:rest])
        except BaseException:
            self._pos = start  # a read that failed moved nothing (its first bytes included)
            raise
        self._pos += rest
        return want

    def _from_small(self, view: memoryview, want: int) -> int:
        """Copy what the small-read buffer holds of the next ``want`` bytes
        into ``view`` (from its start); returns how many."""
        n = self._small.take(self._pos, view, want)
        self._pos += n
        return n

    def close(self) -> None:
        if self.closed:
            return
        if self._inline:
            # Another thread's local read uses the provider's descriptors: closed under
            # it, the read failed with EBADF, or read another file that took the number.
            with self._reads_done:
                self._closing = True
                while self._reads:
                    self._reads_done.wait()
        self._prefetch.close()
        self._small.release()
        try:
            # In a forked child the provider's connections and loop are the parent's.
            if (self._family.leave(self._member) and self._family.owns_provider
                    and self._pid == os.getpid() and not _loop.is_shut_down()):
                if _loop.in_loop_thread():
                    # The garbage collector finalizing a dropped reader on the I/O
                    # thread: run_sync refuses there, and its connections stayed open.
                    _loop.run_soon(self._provider.close())
                else:
                    _loop.run_sync(self._provider.close())
        finally:
            super().close()
            if self._on_close is not None:
                self._on_close()

    def fork(self, *, end: int | None = None) -> StreamReader:
        """An independent reader of the same object version, positioned at 0.

        ``end`` is a hint: read-ahead stops there (reads past it still work).
        Forks share the connection pool, the read boundaries and the
        ``readahead`` memory budget; each measures its own reads and picks
        its own way to fetch them. The pool is closed with the last of the
        reader and its forks to close: a fork reads on after its reader closed.
        """
        self._check_closed()
        end = None if end is None else byte_position(end, "end")
        # Forks share the read-ahead memory budget: ``readahead`` bounds the load.
        fork = StreamReader(self._provider, self._uri, self._info, owns_provider=False, limit=end,
                            budget=self._prefetch.budget, family=self._family)
        if self._boundaries:
            fork.set_read_boundaries(self._boundaries, exact=self._exact)
        return fork

    def read_stats(self) -> dict[str, Any]:
        """How this reader's reads were served, and why (see
        :meth:`tensorstream.readahead.ranged.Prefetcher.stats` for every key):
        bytes received straight into the caller's buffers (``direct_bytes``,
        ``streamed_bytes`` of them by the reader's own stream) or copied from
        read-ahead buffers (``copied_bytes``); the current ``phase``
        (``stream``: one request received in place; ``ranged``: ranged
        requests on ``active`` connections), the ``reason`` for it and the
        ``history`` of decisions; ``peak_active`` connections,
        ``readahead_peak`` bytes of read-ahead memory (``readahead_held``: now);
        the ``streams`` opened.
        Local files are read inline, without the read-ahead: their counters
        stay at 0. The decisions are also logged at DEBUG on
        ``tensorstream.readahead``."""
        return self._prefetch.stats()

    @property
    def readahead(self) -> int:
        """Bytes this reader may plan ahead of its reads (the ``readahead`` option)."""
        return int(self._provider.config.transfer.readahead)

    @property
    def part_size(self) -> int:
        """Bytes of one read-ahead request (the ``part_size`` option)."""
        return int(self._provider.config.transfer.part_size)

    def expect(self, offset: int, buffer: Any) -> None:
        """Say that a later :meth:`readinto` at ``offset`` will fill ``buffer``
        (e.g. a tensor allocated before it is read): read-ahead of those bytes
        is then received straight into ``buffer``, holding no read-ahead
        memory (a request spanning several buffers announced back to back is
        received into each in turn). A hint: reads are exact either way. ``buffer`` must not be
        used until that read returns, and is the caller's once it did (nothing is received
        into what a read returned); expected ranges must not overlap."""
        offset = byte_position(offset, "offset")
        with self._lock:
            self._check_closed()
            if not self._inline:  # local reads have no read-ahead
                self._prefetch.expect(offset, _as_byte_view(buffer))

    def read_ranges(self, ranges: Iterable[tuple[int, Any]]) -> None:
        """Fill each ``(offset, buffer)`` with the bytes at ``offset``: random
        access, beside the sequential read-ahead (the position is unchanged).
        Remote reads run concurrently (``concurrency`` requests at most), each
        straight into its buffer, pinned to the version seen at open; a range
        past the end raises :class:`~tensorstream.errors.InvalidRangeError`."""
        self._check_closed()
        _read_ranges(self._provider, self._uri, self._pin, ranges, inline=self._inline,
                     reading=self._reading)

    def set_read_boundaries(self, offsets: Iterable[int], *, exact: bool = False) -> None:
        """Tell the read-ahead where the caller's reads will start and end
        (e.g. each tensor's header and data). Reads that span whole pieces
        between boundaries are then received straight into the caller's
        buffer instead of being copied out of read-ahead buffers. A hint only:
        any read still works. ``exact``: no request crosses any of them (by
        default, boundaries closer together than ``part_size`` are merged, so
        small tensors share requests); for a caller that announces a buffer
        per stretch (:meth:`expect`)."""
        checked = sorted({byte_position(offset, "boundary") for offset in offsets})
        with self._lock:
            self._boundaries = checked
            self._exact = exact
            self._prefetch.set_boundaries(self._boundaries, exact=exact)

    def set_readahead_end(self, end: int | None) -> None:
        """Read ahead no further than ``end`` (``None``: the end of the object),
        as :meth:`fork`'s ``end`` does: for a reader that is done at ``end``
        (tensorizer's first reader, whose share of the file ends there). A
        hint: reads past it still work."""
        end = None if end is None else byte_position(end, "end")
        with self._lock:
            self._check_closed()
            self._limit = end
            self._prefetch.set_limit(end)

    # -- internals ------------------------------------------------------------
    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """One inline read in progress (:meth:`close` waits for it to end); a
        reader closing or closed raises ValueError, as a closed file."""
        with self._reads_done:
            if self._closing:
                raise ValueError("I/O operation on closed file")
            self._reads += 1
        try:
            yield
        finally:
            with self._reads_done:
                self._reads -= 1
                if not self._reads:
                    self._reads_done.notify_all()


#: Readers open in this process (weak: a dropped reader leaves by itself).
_open_readers: weakref.WeakSet[StreamReader] = weakref.WeakSet()
os.register_at_fork(after_in_child=_adopt_open_readers)
