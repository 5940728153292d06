"""Fault in a destination buffer's pages ahead of the data.

A read's buffer is usually fresh tensor memory; the first write to each page
traps into the kernel, which zeroes it (a third of a fast load's CPU). The
thread waiting for a read has nothing else to do, so it asks the kernel to
populate the pages (``MADV_POPULATE_WRITE``, Linux 5.14+) while other threads
receive into them: the faults move off the receiving threads onto an idle
core. The call never changes the buffer's contents (pages already present are
left alone); where it is unsupported it is skipped. A piece the read-ahead
arena has just faulted in, on huge pages, is skipped too (:func:`mark_present`):
a second pass would only walk its page tables again.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading

__all__ = ["mark_present", "populate"]

_MADV_POPULATE_WRITE = 23
#: Smaller buffers are not worth a system call.
_MIN_BYTES = 1 << 20
#: Pages populated per call.
_CHUNK = 256 << 10

_madvise = None
if sys.platform == "linux":
    try:
        # The process's own symbols (libc is linked into the interpreter), not
        # ctypes.util.find_library("c"): that runs `ldconfig -p` in a child
        # process, 28-41 ms of every `tensorstream cp` (which imports this
        # through the local provider) before its first request.
        try:
            _madvise = ctypes.CDLL(None, use_errno=True).madvise
        except AttributeError:  # pragma: no cover - a libc not linked into the interpreter
            _madvise = ctypes.CDLL("libc.so.6", use_errno=True).madvise
        _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - no usable libc
        _madvise = None

_supported = _madvise is not None
#: Per thread: the span ``(address, end)`` whose pages it has just faulted in.
_present = threading.local()


def mark_present(address: int, end: int) -> None:
    """This thread has just faulted in the pages of ``[address, end)``: its next
    :func:`populate` of a buffer inside the span returns at once. (One-shot; a
    stale mark only costs the faults the read then takes itself.)"""
    _present.span = (address, end)


def populate(view: memoryview, *, piece: int = _CHUNK) -> None:
    """Fault in the whole pages inside ``view`` for writing (best effort).

    Receivers fill a buffer front to back, so it is populated back to front,
    in chunks of ``piece`` bytes: the two meet in the middle instead of racing
    for the same pages. (A caller that copies into the buffer only afterwards
    passes a ``piece`` as large as the buffer: one call.)
    """
    global _supported
    span = getattr(_present, "span", None)
    if span is not None:
        _present.span = None  # one-shot
    if not _supported or view.readonly or view.nbytes < _MIN_BYTES:
        return
    n = view.nbytes
    try:
        # The address of the first byte. Not `(c_char * n).from_buffer`: that makes
        # a new ctypes type per size, cyclic garbage that sets off full garbage
        # collections (hundreds of tensors of distinct sizes: a third of a load).
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError, BufferError):  # e.g. not contiguous: not worth it
        return
    if span is not None and span[0] <= addr and addr + n <= span[1]:
        return
    page = mmap.PAGESIZE
    start = -(-addr // page) * page
    end = (addr + n) // page * page
    assert _madvise is not None
    while end > start:
        lo = max(start, end - piece)
        if _madvise(lo, end - lo, _MADV_POPULATE_WRITE) != 0:
            if ctypes.get_errno() == 22:  # EINVAL: a kernel without the advice
                _supported = False
            return
        end = lo
