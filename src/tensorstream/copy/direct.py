"""Positional writes that bypass the page cache (``O_DIRECT``) where they can.

A durable local copy must have its bytes on the disk before it is reported,
so a page-cache copy of them is pure cost: fresh pages to fault in, then an
fsync that writes them all out at the end. :class:`PositionalWrites` sends
every aligned stretch of a write through a second descriptor of the same
file opened with ``O_DIRECT`` (the disk, straight from the caller's buffer)
and the rest (an unaligned offset, buffer or length: usually only the
object's last few KiB) through the ordinary descriptor; the fsync before
publishing then covers those and the file's metadata.

``O_DIRECT`` needs the buffer's address, the file offset and the length to be
multiples of the device's logical block size. That size cannot be asked of a
file (``statvfs``'s ``f_bsize`` is not it), so :data:`ALIGN` is 4096, a
multiple of it on every common filesystem and device. A filesystem that
refuses ``O_DIRECT`` (tmpfs: ``EINVAL`` at open; some at the first write)
gets buffered writes for that file, silently: only speed differs.

A direct stretch and a buffered one never share a page (direct writes cover
whole aligned pages of one write, and writes never overlap), so the page
cache never holds a stale copy of what went to the disk directly.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

__all__ = ["ALIGN", "PositionalWrites", "open_direct"]

#: Alignment of a direct write's buffer address, file offset and length.
ALIGN = 4096

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def open_direct(dir_fd: int, name: str, fd: int) -> int | None:
    """A write-only ``O_DIRECT`` descriptor of ``name`` in ``dir_fd`` (the file
    ``fd`` is open on), or None where the platform or filesystem has none.

    The name is opened again (``O_DIRECT`` set on ``fd`` with ``F_SETFL``
    would also apply to its reads, which go to unaligned buffers); a name that
    no longer leads to ``fd``'s file is not written through."""
    if not _O_DIRECT:
        return None
    flags = os.O_WRONLY | _O_DIRECT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None  # EINVAL: the filesystem has no direct I/O (tmpfs)
    try:
        a, b = os.fstat(fd), os.fstat(dfd)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return dfd
    except OSError:
        pass
    os.close(dfd)
    return None


def _aligned(view: memoryview) -> bool:
    """Whether ``view`` starts on an :data:`ALIGN` boundary (read-only buffers,
    whose address ctypes will not give, count as unaligned)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view)) % ALIGN == 0
    except (TypeError, ValueError):
        return False


class PositionalWrites:
    """``pwrite`` of whole buffers into one file, direct where aligned.

    ``fd`` is the file's ordinary descriptor (its owner closes it),
    ``direct_fd`` an ``O_DIRECT`` one (:func:`open_direct`; :meth:`close`
    closes it) or None. Safe to call from several threads at once for ranges
    that do not overlap; :meth:`close` only once none is writing."""

    def __init__(self, fd: int, direct_fd: int | None) -> None:
        self.fd = fd
        self._direct_fd = direct_fd
        #: Whether aligned stretches still go to the disk directly.
        self.direct = direct_fd is not None
        #: Bytes written through the ``O_DIRECT`` descriptor so far.
        self.direct_bytes = 0
        self._lock = threading.Lock()

    def write(self, offset: int, data: memoryview) -> None:
        """Write all of ``data`` at ``offset`` (or raise)."""
        view = data
        while view:
            whole = len(view) - len(view) % ALIGN
            if self.direct and whole and offset % ALIGN == 0 and _aligned(view):
                assert self._direct_fd is not None
                try:
                    n = os.pwrite(self._direct_fd, view[:whole], offset)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    # Refused at the first write by this filesystem: buffered
                    # from now on.
                    self.direct = False
                    continue
                with self._lock:
                    self.direct_bytes += n
            else:
                n = os.pwrite(self.fd, view, offset)
            view = view[n:]
            offset += n

    def close(self) -> None:
        """Close the ``O_DIRECT`` descriptor (if any)."""
        dfd, self._direct_fd = self._direct_fd, None
        self.direct = False
        if dfd is not None:
            os.close(dfd)
