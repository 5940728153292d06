"""Page-cache residency of a file, and whether a directory takes ``O_DIRECT``:
how tests tell a write that went to the disk directly from one through the cache."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)


def direct_io_at(path: Path) -> bool:
    """Whether files in directory ``path`` can be opened with ``O_DIRECT``."""
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        fd = os.open(path / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(path / ".probe")
    return True


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (``mincore`` of a mapping never touched)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)
        try:
            rc = _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)),
                               ctypes.c_size_t(size), vec)
        finally:
            del anchor
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec)
