"""tensorizer loads of a local file onto the CPU: a few threads fill the tensors.

Why: tensorizer reads each of its reader's tensors in turn, allocating it
just before reading it, so a local load spends most of its time faulting in
fresh memory one tensor at a time (one thread per reader; a model of one
tensor gets one thread whatever ``num_readers`` says). Here the tensors'
data is read by :mod:`tensorstream.readahead.localfill` (shared with the
safetensors loader): every tensor is mapped before the threads start (one
mapping, on huge pages where they are free and cheap: :mod:`..readahead.arena`), its
span cut into 4 MiB chunks that up to ``num_readers`` threads (never more
than the process's CPUs) take in file order (neighbouring tensors smaller
than a chunk gathered into one), each chunk's pages populated with one
``MADV_POPULATE_WRITE`` and read with one ``preadv`` on the descriptor
tensorizer opened (a file replaced by rename meanwhile is not mixed in).

Everything else stays tensorizer's: its one reader thread parses each
header, allocates the tensor (:mod:`.inplace` arms ``torch.empty`` with the
memory the threads fill), and calls ``readinto``; that read, when it asks
for exactly the bytes the threads fill into exactly that memory, waits until
they have landed, reading chunks itself meanwhile (:meth:`LocalRun.received`),
then tensorizer verifies hashes (``verify_hash``), decrypts in place,
builds the tensor (dtype, shape) and hands it out. A failed read fails the
fill: the tensor it touched, and every later one, raises instead of being
handed out. A read that does not match (memory tensorizer allocated itself)
is read as before, so correctness never depends on the arming.

Taken for a plain local file (:func:`open_local`) loaded onto the CPU; a
CUDA load, a file opened with options (the local provider's reader) and
group loads keep tensorizer's own readers (:func:`fast_path`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import torch
from tensorizer.utils import get_device

from ..errors import InvalidRangeError
from ..providers.local.provider import _preadv_exact, open_regular
from ..readahead import arena
from ..readahead.localfill import ChunkFill, workers
from ..uri import ParsedURI, parse_uri
from . import inplace
from .checked import CheckedSource
from .hook import FilledTensorDeserializer

__all__ = ["LocalRun", "LocalTensorDeserializer", "fast_path", "on_cpu", "open_local"]


def open_local(target: str | ParsedURI, options: Mapping[str, Any]) -> BinaryIO | None:
    """A plain OS file for a local path given with no options, else None.

    tensorizer parses it (headers: small buffered reads) and, on the CPU, the
    tensors' data is read on this descriptor by :class:`LocalTensorDeserializer`;
    elsewhere tensorizer reads it with ``readinto`` straight into each tensor,
    and its extra readers reopen the *same inode* through ``/proc/self/fd``
    (a file replaced by rename meanwhile is not mixed in). Errors are
    tensorstream's (``NotFoundError`` ...).
    """
    if options:
        return None
    parsed = target if isinstance(target, ParsedURI) else parse_uri(target)
    if parsed.scheme != "file":
        return None
    # Through open_regular: a FIFO, socket, device or directory is refused at once
    # (a plain open() of a FIFO blocks until a writer comes).
    f = open(open_regular(parsed.path), "rb", closefd=True)  # the deserializer closes it
    f.raw.name = parsed.path  # type: ignore[attr-defined]  # errors name the path, not the fd
    return f


def fast_path(stream: Any, device: str | torch.device | int | None) -> bool:
    """Whether a load of ``stream`` onto ``device`` (None: tensorizer's default)
    is filled by threads here: a plain local file (:func:`open_local`) onto the CPU.
    (CUDA loads read through tensorizer's pinned staging buffer: its own readers.)"""
    from ..distributed.memory import MemorySource
    from ..file import StreamReader

    if isinstance(stream, StreamReader | MemorySource):
        return False
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return on_cpu(device)


def on_cpu(device: str | torch.device | int | None) -> bool:
    """Whether a load onto ``device`` (None: tensorizer's default) lands on the CPU."""
    resolved = get_device() if device is None else torch.device(device)
    return resolved.type == "cpu"



class LocalRun(inplace.Run):
    """One :meth:`LocalTensorDeserializer._bulk_load_uncached`: the tensors' memory,
    armed for tensorizer's reader thread, filled by the chunk threads."""

    def __init__(self, checked: CheckedSource, entries: list[Any], nworkers: int) -> None:
        super().__init__([], checked._headers)  # Run.arm hands out _claims
        self._checked = checked
        self._fd = checked.fileno()
        self._begins = [int(e.data_offset) for e in entries]
        self._entries = entries
        spans = [(int(e.data_offset), int(e.data_length)) for e in entries]
        # Every tensor is kept (a deserializer holds them all): one mapping, on huge
        # pages where free (readahead.arena: a third of the faulting CPU).
        self._memory = arena.Arena([n for _, n in spans])
        self.fill: ChunkFill[torch.Tensor] = ChunkFill(
            spans, self._memory.tensors.__getitem__, lambda t: t.numpy().data.cast("B"), upfront=True,
            gather=True)
        self._claims = {int(e.offset): self.fill.out[i] for i, e in enumerate(entries)}
        self._addresses = [t.data_ptr() for t in self.fill.out.values()]
        self.nworkers = nworkers
        self._threads: list[Any] = []

    def read_at(self, offset: int, buffers: Sequence[memoryview]) -> None:
        for buf in buffers:  # (a gathered chunk's scratch lies outside the arena: skipped)
            self._memory.populate(buf)
        try:
            # Checked against the version tensorizer's headers came from, before and
            # after: a file rewritten in place mid-load mixed the two versions.
            _preadv_exact(self._fd, self._checked.name, offset, buffers,
                          self._checked.identity)
        except InvalidRangeError as exc:  # the file shrank (in place) since it was opened
            end = offset + sum(b.nbytes for b in buffers)
            raise self._checked.malformed(
                f"the object ended before offset {end} (truncated while loading?)",
                expected=end) from exc

    def start(self) -> None:
        """Start the helper threads (tensorizer's reader thread is one more filler)."""
        import threading

        def work() -> None:
            try:
                self.fill.read_chunks(self.read_at)
            except BaseException:  # kept by the fill; raised where the tensor is awaited
                pass

        for i in range(self.nworkers - 1):
            t = threading.Thread(target=work, name=f"tensorstream-local-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """No more chunks; every helper thread has returned (nothing writes afterwards)."""
        self.fill.stop()
        for t in self._threads:
            t.join()
        self._threads = []

    def received(self, pos: int, view: memoryview) -> bool:
        """Whether ``view`` is tensor memory the threads fill with the file's bytes
        at ``pos`` (then: once they have landed)."""
        i = bisect.bisect_right(self._begins, pos) - 1
        if i < 0 or not view.nbytes:
            return False
        lo = pos - self._begins[i]
        if lo + view.nbytes > int(self._entries[i].data_length):
            return False
        if inplace.address(view) != self._addresses[i] + lo:
            return False
        self.fill.complete(i, self.read_at)
        return True


class LocalTensorDeserializer(FilledTensorDeserializer):
    """A :class:`StreamTensorDeserializer` of a plain local file onto the CPU whose
    tensors are filled by :class:`LocalRun`'s threads; tensorizer runs one reader
    thread (it parses, verifies, decrypts and builds; the threads read).

    ``num_readers``: the threads (at most the CPUs; None: up to
    :data:`~tensorstream.readahead.localfill.MAX_WORKERS`).
    """

    def __init__(self, file_obj: Any, *args: Any, num_readers: int | None = None,
                 **kwargs: Any) -> None:
        self._ts_requested = num_readers or 0
        self._ts_threads = 1
        super().__init__(file_obj, *args, num_readers=1, **kwargs)

    def _bulk_load_uncached(self, keys: Any, verify_hash: bool | None = None) -> Any:
        checked = self._file
        if not keys or not isinstance(checked, CheckedSource) or self._device.type != "cpu":
            yield from super()._bulk_load_uncached(keys, verify_hash)
            return
        # The tensors tensorizer allocates and reads (a meta tensor, written without
        # data, it zero-fills itself), in file order.
        entries = sorted((e for e in map(self._metadata.get, keys)
                          if e is not None and 0 < e.data_length == e.deserialized_length),
                         key=lambda e: e.data_offset)
        nbytes = sum(int(e.data_length) for e in entries)
        run = LocalRun(checked, entries, workers(self._ts_requested, nbytes))
        self._ts_threads = max(self._ts_threads, run.nworkers)
        yield from self._filled(run, keys, verify_hash)

