"""Fill a local file's tensors with a few threads pulling chunks of them.

A local load is not limited by the disk (the file is usually in the page
cache) but by faulting in the tensors' fresh memory: the first write to each
page traps into the kernel, which zeroes it. Those faults run concurrently on
every core, so the tensors' spans are cut into chunks of :data:`CHUNK` bytes
that :func:`workers` threads take in file order: whichever thread has a core
takes the next chunk, so a thread that loses its core on a busy machine does
not leave a fixed half of the file waiting for it (as contiguous halves per
thread do). The local provider faults each chunk's pages in with one system
call before it reads into them.

Tensors are handed to ``emit`` in file order, each once all of its chunks
have landed; after a failed read no tensor that it touched is handed out,
the other threads stop at their next chunk, and the first error is raised
once every thread has returned (nothing writes into a tensor afterwards).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterator

import torch

from ..errors import MalformedFileError
from ..file import StreamReader
from .header import TensorInfo

__all__ = ["CHUNK", "MAX_WORKERS", "fill_local", "workers"]

#: Bytes of one thread's read: small enough that two threads share even a
#: single large tensor and a stalled thread holds up little, large enough that
#: the per-read costs (two ``fstat`` and a ``preadv``) stay negligible.
CHUNK = 4 << 20
#: Threads per local file when the caller does not choose (``num_readers``).
MAX_WORKERS = 4


def workers(requested: int, nbytes: int) -> int:
    """Threads for ``nbytes`` of tensors: ``requested`` (0: :data:`MAX_WORKERS`),
    at most the CPUs this process may run on and one per chunk."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    chunks = max(1, -(-nbytes // CHUNK))
    return max(1, min(requested or MAX_WORKERS, cpus, chunks))


class _Plan:
    """Chunks handed out in file order, and the tensors they complete (shared by the
    threads; every method takes the lock)."""

    def __init__(self, tensors: list[TensorInfo],
                 allocate: Callable[[TensorInfo], torch.Tensor],
                 view: Callable[[torch.Tensor], memoryview], *, upfront: bool) -> None:
        self._tensors = tensors
        self._allocate = allocate
        self._view = view
        self._lock = threading.Lock()
        self._chunks = self._walk()
        self.out: dict[int, torch.Tensor] = {}
        if upfront:
            # Every mapping made before the threads start: mapping memory (mmap) waits
            # for the other threads' MADV_POPULATE_WRITE calls and holds up the next ones.
            self.out = {i: allocate(t) for i, t in enumerate(tensors)}
        self._left: dict[int, int] = {}  # chunks of a tensor not yet landed
        self.ready: dict[int, torch.Tensor] = {}  # complete, not yet emitted
        self.failed = False

    def _walk(self) -> Iterator[tuple[int, int, memoryview | None]]:
        """``(tensor index, file offset, buffer)`` for every chunk; a tensor is
        allocated when its first chunk is handed out (a 0-byte one is complete
        at once: its buffer is None)."""
        for i, t in enumerate(self._tensors):
            tensor = self.out.get(i)
            if tensor is None:
                tensor = self.out[i] = self._allocate(t)
            if not t.nbytes:
                self._left[i] = 0
                self.ready[i] = tensor
                yield i, t.begin, None
                continue
            view = self._view(tensor)
            self._left[i] = -(-t.nbytes // CHUNK)
            for lo in range(0, t.nbytes, CHUNK):
                yield i, t.begin + lo, view[lo:lo + CHUNK]

    def next(self) -> tuple[int, int, memoryview] | None:
        """The next chunk to read; None when there is none (or a read failed)."""
        with self._lock:
            while not self.failed:
                item = next(self._chunks, None)
                if item is None:
                    return None
                i, offset, buf = item
                if buf is not None:
                    return i, offset, buf
        return None

    def landed(self, i: int) -> None:
        with self._lock:
            self._left[i] -= 1
            if self._left[i] == 0:
                self.ready[i] = self.out[i]

    def fail(self) -> None:
        with self._lock:
            self.failed = True

    def take_ready(self, i: int) -> torch.Tensor | None:
        """Tensor ``i`` if it is complete (and no read failed), removed from ``ready``."""
        with self._lock:
            if self.failed:
                return None
            return self.ready.pop(i, None)


def fill_local(reader: StreamReader, tensors: list[TensorInfo], nworkers: int,
               allocate: Callable[[TensorInfo], torch.Tensor],
               view: Callable[[torch.Tensor], memoryview],
               emit: Callable[[TensorInfo, torch.Tensor], None], *, upfront: bool = False) -> None:
    """Read ``tensors`` (file order) of the local file behind ``reader`` on
    ``nworkers`` threads (the caller's among them) and ``emit`` each in file
    order once it is complete. ``allocate`` makes a tensor's memory, ``view``
    its writable byte view. ``upfront``: allocate every tensor before the threads
    start (for a caller that keeps them all: memory only mapped costs no RSS
    until it is read into; not for pinned memory, resident at once, nor for a
    consumer that frees tensors as they come), else each when its first chunk
    is handed out."""
    plan = _Plan(tensors, allocate, view, upfront=upfront and nworkers > 1)
    emit_lock = threading.Lock()
    emitted = 0  # tensors handed out, in file order (under emit_lock)

    def emit_ready() -> None:
        nonlocal emitted
        with emit_lock:  # one thread emits at a time, in order
            while emitted < len(tensors):
                tensor = plan.take_ready(emitted)
                if tensor is None:
                    return
                t, emitted = tensors[emitted], emitted + 1
                emit(t, tensor)

    def work(r: StreamReader) -> None:
        try:
            while (item := plan.next()) is not None:
                i, offset, buf = item
                r.seek(offset)
                if r.readinto(buf) != len(buf):  # pragma: no cover - the reader raises first
                    raise MalformedFileError(f"{r.name} is truncated in tensor "
                                             f"{tensors[i].name!r}")
                plan.landed(i)
                emit_ready()
            emit_ready()  # 0-byte tensors after the last chunk
        except BaseException:
            plan.fail()
            raise

    forks = [reader.fork() for _ in range(max(0, nworkers - 1))]
    try:
        if not forks:
            work(reader)
            return
        with concurrent.futures.ThreadPoolExecutor(len(forks),
                                                   thread_name_prefix="tensorstream-local") as pool:
            futures = [pool.submit(work, r) for r in forks]
            first: BaseException | None = None
            try:
                work(reader)
            except BaseException as exc:
                first = exc
            for fut in futures:  # every thread has returned before anything is raised
                try:
                    fut.result()
                except BaseException as exc:
                    first = first or exc
            if first is not None:
                raise first
    finally:
        for r in forks:
            r.close()
