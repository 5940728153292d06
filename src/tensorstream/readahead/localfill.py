"""Fill tensors from a local file with a few threads pulling chunks of them.

A local load is not limited by the disk (the file is usually in the page
cache) but by faulting in the tensors' fresh memory: the first write to each
page traps into the kernel, which zeroes it. Those faults run concurrently on
every core, so the tensors' spans are cut into chunks of :data:`CHUNK` bytes
that threads take in file order: whichever thread has a core takes the next
chunk, so a thread that loses its core on a busy machine does not leave a
fixed half of the file waiting for it (as contiguous halves per thread do),
and one large tensor is shared by every thread. Each read faults its chunk's
pages in with one system call before it copies into them (the local
provider's ``_preadv_exact``).

A fill that *gathers* (the tensorizer loader's) reads a run of neighbouring
tensors smaller than a chunk as one chunk: one ``preadv`` into all of their
buffers (the few bytes between them, tensorizer's next header, land in a
scratch buffer) instead of one read per tensor: each read costs system
calls and hand-offs of the interpreter lock, which add up over hundreds of
small tensors (measured in docs/benchmarks.md, "Session 23").

Shared by the safetensors loader (``safetensors/_local.py``: threads that
emit each tensor once complete) and the tensorizer loader
(``tensorizer/local.py``: tensorizer's reader thread waits for each tensor,
taking chunks itself meanwhile). After a failed read no span it touched is
reported complete, the other threads stop at their next chunk, and the
error is kept for whoever waits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

__all__ = ["CHUNK", "MAX_WORKERS", "ChunkFill", "ReadAt", "workers"]

#: Bytes of one thread's read: small enough that two threads share even a
#: single large tensor and a stalled thread holds up little, large enough that
#: the per-read costs (two ``fstat`` and a ``preadv``) stay negligible.
CHUNK = 4 << 20
#: Threads per local file when the caller does not choose (``num_readers``).
MAX_WORKERS = 4
#: The most bytes between two spans a gathered chunk reads past (into scratch).
MAX_GAP = 64 << 10
#: The most buffers of one gathered read (spans and gaps; the kernel takes 1024).
MAX_BUFFERS = 256

T = TypeVar("T")
#: Fills the buffers, in order, with the file's consecutive bytes from the
#: offset, or raises.
ReadAt = Callable[[int, Sequence[memoryview]], object]
#: One chunk: the spans it completes a piece of, its file offset, its buffers.
_Chunk = tuple[tuple[int, ...], int, list[memoryview]]


def workers(requested: int, nbytes: int) -> int:
    """Threads for ``nbytes`` of tensors: ``requested`` (0: :data:`MAX_WORKERS`),
    at most the CPUs this process may run on and one per chunk."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    chunks = max(1, -(-nbytes // CHUNK))
    return max(1, min(requested or MAX_WORKERS, cpus, chunks))


class _Stopped(Exception):
    """The fill was stopped (not failed) before a waited-for span completed."""


class ChunkFill(Generic[T]):
    """The chunks of ``spans`` (``(file offset, bytes)``, in file order), handed out
    in file order to the threads that read them, and which spans are complete.

    ``allocate(i)`` makes span ``i``'s destination, ``view`` its writable byte
    view. ``upfront``: every destination is made now (before any thread reads:
    mapping memory waits for the other threads' ``MADV_POPULATE_WRITE`` calls
    and would hold up the next mapping), else each when its first chunk is
    handed out. ``gather``: a run of neighbouring spans smaller than a chunk
    (at most :data:`MAX_GAP` apart) is one chunk. Thread-safe: every method
    takes the lock.
    """

    def __init__(self, spans: Sequence[tuple[int, int]], allocate: Callable[[int], T],
                 view: Callable[[T], memoryview], *, upfront: bool,
                 gather: bool = False) -> None:
        self._spans = list(spans)
        self._allocate = allocate
        self._view = view
        self._gather = gather
        self._chunk = CHUNK  # read now: tests make it small
        self._cond = threading.Condition()
        self.out: dict[int, T] = {}
        if upfront:
            self.out = {i: allocate(i) for i in range(len(self._spans))}
        self._left: dict[int, int] = {}  # chunks of a span not yet landed
        self.ready: dict[int, T] = {}  # complete, not yet taken (take_ready)
        self.error: BaseException | None = None
        self._stopped = False
        self._chunks = self._walk()

    def _destination(self, i: int) -> T:
        out = self.out.get(i)
        if out is None:
            out = self.out[i] = self._allocate(i)
        return out

    def _walk(self) -> Iterator[_Chunk]:
        """Every chunk, in file order; a span's destination is made when its
        first chunk is handed out (an empty span is complete at once: a chunk
        of no buffers)."""
        spans, chunk = self._spans, self._chunk
        i = 0
        while i < len(spans):
            begin, nbytes = spans[i]
            out = self._destination(i)
            if not nbytes:
                self._left[i] = 0
                self.ready[i] = out
                yield (i,), begin, []
            elif self._gather and nbytes < chunk:
                run, buffers, end = [i], [self._view(out)], begin + nbytes
                while i + 1 < len(spans) and len(buffers) + 2 <= MAX_BUFFERS:
                    nxt, size = spans[i + 1]
                    if not 0 < size < chunk or not end <= nxt <= end + MAX_GAP \
                            or nxt + size - begin > chunk:
                        break
                    if nxt > end:  # (tensorizer's next header: read, not kept)
                        buffers.append(memoryview(bytearray(nxt - end)))
                    i += 1
                    run.append(i)
                    buffers.append(self._view(self._destination(i)))
                    end = nxt + size
                for j in run:
                    self._left[j] = 1
                yield tuple(run), begin, buffers
            else:
                view = self._view(out)
                self._left[i] = -(-nbytes // chunk)
                for lo in range(0, nbytes, chunk):
                    yield (i,), begin + lo, [view[lo:lo + chunk]]
            i += 1

    def _next_locked(self) -> _Chunk | None:
        while self.error is None and not self._stopped:
            item = next(self._chunks, None)
            if item is None:
                return None
            if item[2]:
                return item
            self._cond.notify_all()  # an empty span completed
        return None

    def next(self) -> _Chunk | None:
        """The next chunk to read; None when there is none (or the fill failed or stopped)."""
        with self._cond:
            return self._next_locked()

    def landed(self, spans: Sequence[int]) -> None:
        """A chunk of each of ``spans`` has landed."""
        with self._cond:
            done = False
            for i in spans:
                self._left[i] -= 1
                if self._left[i] == 0:
                    self.ready[i] = self.out[i]
                    done = True
            if done:
                self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """A read failed: no more chunks are handed out; waiters raise ``exc``."""
        with self._cond:
            if self.error is None:
                self.error = exc
            self._cond.notify_all()

    def stop(self) -> None:
        """Hand out no more chunks (the load ended or was abandoned)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def take_ready(self, i: int) -> T | None:
        """Span ``i``'s destination if it is complete (and nothing failed), removed
        from ``ready`` and from ``out``: the fill keeps no reference to what it
        handed out (``iter_tensors`` held every tensor of a file to its end, though
        its consumer freed each one)."""
        with self._cond:
            if self.error is not None:
                return None
            out = self.ready.pop(i, None)
            if out is not None:
                self.out.pop(i, None)
            return out

    def _read(self, item: _Chunk, read_at: ReadAt) -> None:
        spans, offset, buffers = item
        try:
            read_at(offset, buffers)
        except BaseException as exc:
            self.fail(exc)
            raise
        self.landed(spans)

    def read_chunks(self, read_at: ReadAt, then: Callable[[], None] | None = None) -> None:
        """Read chunks until none is left (``then`` after each); a failed read
        fails the fill and raises."""
        while (item := self.next()) is not None:
            self._read(item, read_at)
            if then is not None:
                then()

    def complete(self, i: int, read_at: ReadAt) -> T:
        """Span ``i``'s destination once all of it has landed, reading chunks (in
        file order, from wherever the fill is) while it has not; raises the
        fill's error if a read failed."""
        while True:
            with self._cond:
                if self.error is not None:
                    raise self.error
                if self._left.get(i) == 0:
                    return self.out[i]
                item = self._next_locked()
                if item is None:
                    if self.error is None and self._stopped:
                        raise _Stopped(f"span {i} was not read: the fill was stopped")
                    if self.error is None:
                        self._cond.wait()  # its last chunks are in other threads' hands
                    continue
            self._read(item, read_at)
