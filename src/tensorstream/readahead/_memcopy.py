"""Copies into caller buffers that let other threads run meanwhile.

A buffer handed to a read is usually fresh tensor memory: the first write to
each page faults it in, which costs more than the copy itself. A slice
assignment does that while holding the GIL, so the threads receiving the
next chunks stall behind it. ``ctypes.memmove`` is a foreign call, which
releases the GIL for its duration.
"""

from __future__ import annotations

import ctypes

__all__ = ["copy_into"]

#: Below this, the foreign call costs more than it frees.
_SMALL_COPY = 64 << 10


def copy_into(dst: memoryview, src: bytes | bytearray | memoryview) -> None:
    """``dst[:len(src)] = src`` for byte buffers, without the GIL when large.

    ``dst`` must be a writable, C-contiguous byte view at least as long as
    ``src``; a shorter one raises ``ValueError`` (never a partial copy).
    """
    n = len(src) if not isinstance(src, memoryview) else src.nbytes
    if n < _SMALL_COPY or dst.readonly or dst.nbytes < n:
        dst[:n] = src  # the slice assignment checks lengths and raises
        return
    # Addresses of first bytes, not `(c_char * n).from_buffer`: that makes a new
    # ctypes type per length, cyclic garbage that sets off full collections.
    target = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    if isinstance(src, bytes):
        ctypes.memmove(target, src, n)  # a bytes argument passes its buffer's address
    elif not (isinstance(src, memoryview) and src.readonly):
        if isinstance(src, memoryview) and not src.c_contiguous:
            dst[:n] = src
            return
        ctypes.memmove(target, ctypes.addressof(ctypes.c_char.from_buffer(src)), n)
    else:
        dst[:n] = src
