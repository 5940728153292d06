"""Fill a local safetensors file's tensors with a few threads pulling chunks of them.

The chunks, their order and the threads' bounds are
:mod:`tensorstream.readahead.localfill`'s (shared with the tensorizer loader).
Here: each thread reads through its own fork of the file's reader or, for a
plain local file, all of them through one pinned descriptor
(:class:`~tensorstream.providers.local.provider.PinnedFile`) with neighbouring
tensors smaller than a chunk gathered into one read; tensors are handed to
``emit`` in file order, each once all of its chunks
have landed; after a failed read no tensor that it touched is handed out,
the other threads stop at their next chunk, and the first error is raised
once every thread has returned (nothing writes into a tensor afterwards).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence

import torch

from ..errors import MalformedFileError
from ..file import StreamReader
from ..readahead.localfill import CHUNK, MAX_WORKERS, ChunkFill, ReadAt, workers
from .header import TensorInfo

__all__ = ["CHUNK", "MAX_WORKERS", "fill_local", "workers"]


def fill_local(reader: StreamReader, tensors: list[TensorInfo], nworkers: int,
               allocate: Callable[[TensorInfo], torch.Tensor],
               view: Callable[[torch.Tensor], memoryview],
               emit: Callable[[TensorInfo, torch.Tensor], None], *, upfront: bool = False,
               before_read: Callable[[memoryview], object] | None = None,
               read_at: ReadAt | None = None) -> None:
    """Read ``tensors`` (file order) of the local file behind ``reader`` on
    ``nworkers`` threads (the caller's among them) and ``emit`` each in file
    order once it is complete. ``allocate`` makes a tensor's memory, ``view``
    its writable byte view. ``upfront``: allocate every tensor before the threads
    start (for a caller that keeps them all: memory only mapped costs no RSS
    until it is read into; not for pinned memory, resident at once, nor for a
    consumer that frees tensors as they come), else each when its first chunk
    is handed out. ``before_read(buf)``: called before each chunk's read into
    ``buf`` (the arena's adaptive fault-in, :meth:`.readahead.arena.Arena.populate`).
    ``read_at``: reads gathered chunks for every thread (a
    :class:`~tensorstream.providers.local.provider.PinnedFile`'s), instead of
    one ``readinto`` per tensor through forks of ``reader``."""
    plan = ChunkFill([(t.begin, t.nbytes) for t in tensors], lambda i: allocate(tensors[i]),
                     view, upfront=upfront and nworkers > 1, gather=read_at is not None)
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

    def gathered(offset: int, buffers: Sequence[memoryview]) -> None:
        assert read_at is not None
        if before_read is not None:
            for buf in buffers:  # (a gap's scratch is no tensor's: the arena skips it)
                before_read(buf)
        read_at(offset, buffers)

    def work(r: StreamReader | None) -> None:
        def one_by_one(offset: int, buffers: Sequence[memoryview]) -> None:
            assert r is not None
            r.seek(offset)
            for buf in buffers:  # (one: this fill does not gather)
                if before_read is not None:
                    before_read(buf)
                if r.readinto(buf) != len(buf):  # pragma: no cover - the reader raises first
                    raise MalformedFileError(f"{r.name} is truncated at offset {offset}")

        try:
            plan.read_chunks(one_by_one if r is not None else gathered, emit_ready)
            emit_ready()  # 0-byte tensors after the last chunk
        except BaseException as exc:
            plan.fail(exc)
            raise

    mine: StreamReader | None = reader if read_at is None else None
    forks: list[StreamReader | None] = (
        [reader.fork() for _ in range(max(0, nworkers - 1))] if read_at is None
        else [None] * max(0, nworkers - 1))
    try:
        if not forks:
            work(mine)
            return
        with concurrent.futures.ThreadPoolExecutor(len(forks),
                                                   thread_name_prefix="tensorstream-local") as pool:
            futures = [pool.submit(work, r) for r in forks]
            first: BaseException | None = None
            try:
                work(mine)
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
            if r is not None:
                r.close()
