"""tensorizer loads received straight into the tensors' own memory (CPU loads).

Why: tensorizer allocates each tensor (``torch.empty`` of its bytes) in its
reader thread just before it reads it, so everything the read-ahead fetched
before that moment had to wait in read-ahead buffers and be copied out.
On a paced link those buffers are what bounded both the peak RSS (the
``readahead`` budget, 64 MiB, on top of the tensors) and the connections
in flight (a buffer is held for the whole of its request). Here the tensors
are allocated *early*, when the read-ahead is about to reach them, and
announced to the reader (:meth:`StreamReader.expect`): their segments are
received in place and hold no read-ahead memory, so the read-ahead is
bounded by bytes *ahead* (twice ``readahead`` over announced memory: segments
that arrived before the reader wants them do not hold connections idle),
not by buffers.

How, without changing what tensorizer does:

* :func:`plan` cuts a reader's run of tensors into *blocks*: one per tensor
  of at least :data:`MIN_INPLACE` bytes, its data followed by the next
  header and any smaller tensors up to the next block (:data:`MAX_TAIL`
  bytes at most), so that the blocks of tensors stored one after the other
  lie back to back and cover the file. A request never needs to stop between tensors: one
  that spans several blocks is received into each in turn (the read-ahead's
  scatter receive, HTTP and S3), so hundreds of small tensors still share
  ``part_size`` requests, and the headers in the tails are copied out when
  tensorizer reads them. (Where a provider cannot scatter, such a request
  is received into a read-ahead buffer and copied, as before.)
* :class:`Run` allocates blocks ahead of the reader (twice ``readahead``,
  plus two ``part_size``, past every read) and announces them; when tensorizer reads a
  tensor's header (:class:`~tensorstream.tensorizer.checked.CheckedSource`
  calls :meth:`Run.arm` on the run :func:`run_for` finds), that tensor's memory is armed
  for the reader thread.
* tensorizer's ``_copy_thread`` runs as a copy (:func:`copy_thread`) whose
  global ``torch`` is :data:`TORCH`: its ``torch.empty`` of exactly the armed
  tensor's bytes returns that memory; every other call is torch's own. The
  tensor tensorizer then builds (``from_numpy`` over it) owns only its own
  bytes, as before; the tail stays allocated with it.

Nothing here decides correctness: a tensor whose memory is not armed is
allocated and read as before (copied out of read-ahead buffers or received
straight into it), and reads are exact either way. A failed segment raises
from the read of its bytes, before tensorizer hands the tensor out.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..file import StreamReader

__all__ = ["MAX_TAIL", "MIN_INPLACE", "TORCH", "Block", "Run", "address", "copy_thread", "plan",
           "run_for", "running", "with_globals"]

#: Tensors at least this large get memory of their own before they are read
#: (requests spanning several are scattered into each); smaller ones (norms,
#: biases) ride in the tail of the tensor before them, within :data:`MAX_TAIL`
#: (a block of their own between two large tensors would be a request of its own).
MIN_INPLACE = 64 << 10
#: Bytes after a tensor's data (the next header, small tensors below
#: :data:`MIN_INPLACE`) that ride in its allocation and its requests, at most.
MAX_TAIL = 64 << 10

_local = threading.local()


@dataclasses.dataclass
class Block:
    """One allocation: a tensor's data at ``start`` (``nbytes``), then its tail up to
    ``end``; or (``nbytes`` 0) only the header at ``start`` (read by copying it out)."""

    start: int
    end: int
    header: int  # where the tensor's header starts (tensorizer reads it first)
    nbytes: int


def plan(entries: Sequence[Any], *, min_size: int = MIN_INPLACE,
         max_tail: int = MAX_TAIL) -> list[Block]:
    """The blocks of one reader's tensors (tensorizer ``TensorEntry``\\ s in file order)."""
    blocks: list[Block] = []
    cur: Block | None = None
    for e in entries:
        start, end = int(e.data_offset), int(e.data_offset) + int(e.data_length)
        own = (e.data_length >= min_size
               and getattr(e, "deserialized_length", e.data_length) == e.data_length)
        if cur is not None and e.offset == cur.end:  # contiguous: the tail may take it
            reach = start if own else end
            if reach - (cur.start + cur.nbytes) <= max_tail:
                cur.end = reach
            else:
                cur = None
        else:
            cur = None
        if own:
            if cur is None and 0 < start - e.offset <= max_tail:
                # A header no tail holds (a reader's first, one after a gap): a block
                # of its own, so a request starting there is received in place too.
                blocks.append(Block(int(e.offset), start, int(e.offset), 0))
            cur = Block(start, end, int(e.offset), int(e.data_length))
            blocks.append(cur)
    return blocks


class Run:
    """The blocks of one reader thread's tensors, allocated as its reads approach them."""

    def __init__(self, blocks: list[Block], headers: object) -> None:
        self.blocks = blocks
        self.headers = headers  # identifies the load's CheckedSource (and its children)
        self._next = 0
        self._claims: dict[int, torch.Tensor] = {}  # header offset -> the tensor's bytes
        self._reader: StreamReader | None = None
        self._ahead = 0

    def edges(self) -> list[int]:
        return sorted({x for b in self.blocks for x in (b.start, b.end)})

    def before_read(self, reader: Any, pos: int, nbytes: int) -> None:
        """Allocate and announce the blocks the read-ahead may reach after this read."""
        if not isinstance(reader, StreamReader):
            return
        if reader is not self._reader:
            # This thread's reader (a fork, or the opened stream): the request grid
            # starts at this run's large tensors (small ones share requests).
            self._reader = reader
            # (the read-ahead plans twice ``readahead`` over announced buffers)
            self._ahead = 2 * reader.readahead + 2 * reader.part_size
            reader.set_read_boundaries(self.edges())
        upto = pos + nbytes + self._ahead
        while self._next < len(self.blocks) and self.blocks[self._next].start < upto:
            b = self.blocks[self._next]
            self._next += 1
            memory = torch.empty(b.end - b.start, dtype=torch.uint8, device="cpu")
            reader.expect(b.start, memory.numpy())
            if b.nbytes:
                self._claims[b.header] = memory[: b.nbytes]

    def arm(self, header: int) -> None:
        """tensorizer reads the header at ``header``: its next allocation is this tensor's."""
        _local.armed = self._claims.pop(header, None)

    def received(self, pos: int, view: memoryview) -> bool:
        """Whether the bytes at ``pos`` are already in ``view`` (once this returns):
        never here; a local load's threads fill its tensors (``tensorizer/local.py``)."""
        return False

    def detached(self) -> bool:
        """Whether other threads read the stream (``tensorizer/remote.py``): the
        reader thread then moves only its own position and reads what
        :meth:`received` does not serve by position-free ranged reads."""
        return False


def address(view: memoryview) -> int | None:
    """Where ``view``'s bytes start (None: read-only, empty or not contiguous): how a
    run tells the memory it armed from a buffer tensorizer allocated itself."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError, BufferError):
        return None


def run_for(checked: Any) -> Run | None:
    """The in-place run of ``checked`` (a ``CheckedSource``) on this thread: None
    for another load's file, or no in-place load on this thread. Looked up once
    per read (tensorizer reads each tensor in three: a hot path)."""
    run: Run | None = getattr(_local, "run", None)
    if run is None or run.headers is not getattr(checked, "_headers", None):
        return None
    return run


class _Torch(types.ModuleType):
    """``torch`` for tensorizer's copy threads: ``empty`` may return armed memory."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty(*args: Any, **kwargs: Any) -> Any:
        armed: torch.Tensor | None = getattr(_local, "armed", None)
        if armed is not None:
            _local.armed = None
            # exactly tensorizer's per-tensor allocation (hook.check_compat)
            if (args == ((armed.numel(),),) and kwargs.get("dtype") is torch.uint8
                    and str(kwargs.get("device")) == "cpu" and len(kwargs) == 2):
                return armed
        return torch.empty(*args, **kwargs)


#: What tensorizer's copy threads see as ``torch`` (see :func:`copy_thread`).
TORCH = _Torch("torch")


def copy_thread(base: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of tensorizer's ``_copy_thread`` whose global ``torch`` is :data:`TORCH`.

    A copy of its module's globals, taken now: later changes to that module
    are seen by the next load, and nothing outside this copy is patched.
    """
    return with_globals(base, torch=TORCH)


def with_globals(base: Callable[..., Any], **names: Any) -> Callable[..., Any]:
    """A copy of the function ``base`` whose globals are its module's (copied now) with
    ``names`` replaced."""
    namespace = dict(base.__globals__)
    namespace.update(names)
    fn = types.FunctionType(base.__code__, namespace, base.__name__, base.__defaults__,
                            base.__closure__)
    fn.__kwdefaults__ = base.__kwdefaults__
    fn.__qualname__ = base.__qualname__
    return fn


@contextlib.contextmanager
def running(run: Run | None) -> Iterator[None]:
    """Make ``run`` this thread's in-place load while the block runs."""
    _local.run, _local.armed = run, None
    try:
        yield
    finally:
        _local.run = _local.armed = None
