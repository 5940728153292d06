"""Where ``cp`` puts parts, and what its destinations share: the part plan
(:func:`plan_parts`), the pool of part buffers, the batched directory fsync, and
:class:`SequentialSink`, which feeds a writer that only appends (not S3 or Redis,
which take parts in any order) in order, holding early parts in a window bounded by
the shared buffer pool. A local destination's temp file is
:class:`~.part_file.LocalPartFile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mmap
import os
import threading
from collections.abc import Sequence
from typing import Any, overload

from ..providers.base import Writer
from ..providers.local.provider import temp_stem

__all__ = ["LARGE_PART_MEMORY", "BufferPool", "DirectorySync", "PartBuffer", "Parts", "SequentialSink",
           "digest", "directory_sync", "plan_parts", "temp_stem"]

#: A part buffer: a private anonymous memory map. Unlike ``bytearray(n)``
#: (zero-filled eagerly: ~4 ms per 8 MiB, on the event loop), its pages are
#: zeroed lazily by the kernel when the data first lands in them.
PartBuffer = mmap.mmap


def new_buffer(size: int) -> PartBuffer:
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def digest(data: memoryview | bytes) -> str:
    """Checksum of one part (sha256: hardware-accelerated, releases the GIL)."""
    return hashlib.sha256(data).hexdigest()


class Parts(Sequence[tuple[int, int]]):
    """``(start, end)`` of every part of a ``size``-byte object, computed on demand.

    Sizes come from servers: a HEAD claiming 10**18 bytes is 10**11 parts, which
    must never be a list in memory. Indexing, ``len`` and iteration cost nothing
    up front."""

    def __init__(self, size: int, part_size: int) -> None:
        if part_size < 1:
            raise ValueError("part_size must be >= 1")
        self.size = max(0, size)
        self.part_size = part_size

    def __len__(self) -> int:
        return -(-self.size // self.part_size)

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[int, int]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.part_size
        return start, min(start + self.part_size, self.size)


def plan_parts(size: int, part_size: int) -> Parts:
    """``(start, end)`` of every part of a ``size``-byte object (lazily: see :class:`Parts`)."""
    return Parts(size, part_size)


#: The memory the buffers of parts larger than asked may take whatever the settings (S3
#: takes at most 10,000 parts: a 5 TiB object's are 525 MiB).
LARGE_PART_MEMORY = 2 << 30


def pool_count(full: int, part_size: int, asked: int) -> int:
    """Buffers for parts of ``part_size`` where ``full`` buffers of ``asked`` bytes (the
    ``--part-size``) are the copy's pool: ``full`` of parts up to ``asked``; of larger
    ones (an S3 object over 10,000 parts of ``asked``: 1/10,000 of its size) as many as fit
    in the memory ``full`` parts of ``asked`` take, or :data:`LARGE_PART_MEMORY` if that
    is more, and at least 2 (one filling while one is sent). Without it a 5 TiB object's
    pool was 40 x 525 MiB = 21 GiB at the default settings.

    >>> pool_count(40, 8 << 20, 8 << 20), pool_count(40, 62 << 20, 8 << 20)
    (40, 33)
    >>> pool_count(40, 525 << 20, 8 << 20), pool_count(40, 5 << 30, 8 << 20)
    (3, 2)
    """
    if part_size <= asked:
        return full
    return max(2, min(full, max(full * asked, LARGE_PART_MEMORY) // part_size))


class BufferPool:
    """At most ``count`` part buffers of ``size`` bytes, reused between parts.

    This is what bounds ``cp``'s memory. A buffer whose part was cancelled
    may still be written by a worker thread, so it is dropped, never reused.
    """

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        #: Buffers at most (the parts of one pool in flight at once).
        self.count = count
        self._count = count
        self._allocated = 0
        self._free: asyncio.Queue[PartBuffer] = asyncio.Queue()

    async def get(self) -> PartBuffer:
        if self._free.empty() and self._allocated < self._count:
            self._allocated += 1
            return new_buffer(self.size)
        return await self._free.get()

    def put(self, buf: PartBuffer) -> None:
        self._free.put_nowait(buf)

    def drop(self, buf: PartBuffer) -> None:
        """Retire ``buf`` (still in use by a thread, whose memoryview keeps it
        mapped) and put a fresh one in its place, which also wakes a waiter."""
        self._free.put_nowait(new_buffer(self.size))


class DirectorySync:
    """Group commit of directory fsyncs: one ``fsync`` of a directory covers every
    rename into it that finished before the ``fsync`` started.

    A durable copy renames each finished file into place and then fsyncs the
    directory, so that the name survives a crash before the object is reported
    copied. Objects finishing together (a folder: 32 at once) each fsynced the
    same directory, every call a journal commit to wait for; here a thread whose
    rename is done waits for the ``fsync`` in progress (which may have started
    before its rename, so it does not count) and then the next one, which one
    of the waiting threads issues for all of them. A thread returns only when
    an ``fsync`` that started after its rename has returned: the guarantee of
    its own call, with fewer calls."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: (st_dev, st_ino) -> [tickets issued, tickets covered, an fsync in progress]
        self._dirs: dict[tuple[int, int], list[int]] = {}

    def sync(self, dir_fd: int) -> None:
        """Return once an ``fsync`` of ``dir_fd``'s directory that started after
        this call did has returned. Errors are ignored, as for one ``fsync``
        (some filesystems refuse to fsync a directory)."""
        st = os.fstat(dir_fd)
        key = (st.st_dev, st.st_ino)
        with self._cond:
            state = self._dirs.setdefault(key, [0, 0, 0])
            state[0] += 1
            ticket = state[0]
            while state[1] < ticket:
                if state[2]:
                    self._cond.wait()
                    continue
                state[2] = 1
                covers = state[0]  # every rename whose ticket was issued before this fsync
                self._cond.release()
                try:
                    with contextlib.suppress(OSError):
                        os.fsync(dir_fd)
                finally:
                    self._cond.acquire()
                    state[2] = 0
                    state[1] = max(state[1], covers)
                    self._cond.notify_all()
            if state[1] == state[0] and not state[2] and self._dirs.get(key) is state:
                # Nobody waits on it: forget the directory. Only this state: a
                # thread waking late (its ticket covered by a later fsync, the
                # directory forgotten and taken up anew meanwhile) removed a
                # newer one, fsync in progress and all, and the next thread
                # started a second fsync of the directory beside it.
                del self._dirs[key]


    def _after_fork_in_child(self) -> None:
        """A child has none of its parent's other threads: the lock one of them held
        at the fork stays held, and the fsync one of them had in progress never ends
        (the child's sync of that directory waited for it for ever). Both start afresh."""
        self._cond = threading.Condition()
        self._dirs = {}


#: One per process: an fsync covers renames of every copy into that directory.
directory_sync = DirectorySync()
os.register_at_fork(after_in_child=directory_sync._after_fork_in_child)


class SequentialSink:
    """Feed parts that complete out of order to a sequential writer, in order."""

    def __init__(self, writer: Writer, pool: BufferPool, *, sha256: bool = False) -> None:
        self.writer = writer
        self.pool = pool
        #: sha256 of everything written, in order (``sha256=True``).
        self.hash = hashlib.sha256() if sha256 else None
        self._ready: dict[int, tuple[PartBuffer, int]] = {}
        self._next = 0
        self._changed = asyncio.Event()

    def deliver(self, index: int, buf: PartBuffer, length: int) -> None:
        """Hand over a finished part (the sink now owns ``buf``)."""
        self._ready[index] = (buf, length)
        self._changed.set()

    async def run(self, count: int) -> None:
        """Write parts ``0..count-1`` in order as they become ready."""
        while self._next < count:
            while self._next not in self._ready:
                self._changed.clear()
                await self._changed.wait()
            buf, length = self._ready.pop(self._next)
            try:
                # A copy: a writer may keep the data after write() returns.
                data = bytes(memoryview(buf)[:length])
                if self.hash is not None:
                    self.hash.update(data)
                await self.writer.write(data)
            finally:
                self.pool.put(buf)
            self._next += 1

    def release_all(self) -> None:
        for buf, _ in self._ready.values():
            self.pool.put(buf)
        self._ready.clear()
