"""The file protocol of a read-only, seekable binary file over one primitive.

:class:`ReadOnlyFile` is :class:`~tensorstream.file.StreamReader`'s ``io``
surface: ``seek``/``tell``, ``read``, ``read1``, ``peek``, ``readinto1``, the
refusals of a read-only file, and a closed file answering nothing but
``closed``. A subclass supplies where the bytes come from: ``_readinto(view)``
at ``_pos`` (called with ``_lock`` held), ``size`` and ``_uri`` (named when a
read's buffer cannot be allocated).
"""

from __future__ import annotations

import io
import operator
import threading
from typing import Any

from .errors import UnsupportedOperationError
from .headroom import read_buffer
from .uri import ParsedURI

__all__ = ["READ1_DEFAULT", "ReadOnlyFile", "byte_position"]

#: What ``read1(-1)`` returns at most (a buffered file's one raw read).
READ1_DEFAULT = 1 << 20
#: The first read of a :meth:`ReadOnlyFile.readline` (doubled while no line ends).
LINE_CHUNK = io.DEFAULT_BUFFER_SIZE


def byte_position(value: Any, what: str) -> int:
    """A byte position given to a reader: an integer (anything with ``__index__``,
    else TypeError, as ``seek``), never negative (ValueError)."""
    pos = operator.index(value)
    if pos < 0:
        raise ValueError(f"negative {what} {pos}")
    return pos


class ReadOnlyFile(io.RawIOBase):
    """``io``'s read-only, seekable binary file over :meth:`_readinto` (see the module)."""

    _pos: int
    _lock: threading.RLock
    _uri: ParsedURI
    #: The last chunk :meth:`readline` read and where it starts: the next lines are in
    #: it (a read of its own a line, 45 µs, made a 5 MB file's lines take 9 s).
    _line_chunk: tuple[bytes, int] = (b"", 0)

    @property
    def size(self) -> int:
        raise NotImplementedError

    def _readinto(self, b: Any) -> int:
        """Read up to ``len(b)`` bytes at ``_pos`` and move past them (``_lock`` held)."""
        raise NotImplementedError

    @property
    def mode(self) -> str:
        return "rb"


    # -- io.RawIOBase ---------------------------------------------------------
    # As io's files, a closed file answers nothing but ``closed`` (ValueError).
    def readable(self) -> bool:
        self._check_closed()
        return True

    def seekable(self) -> bool:
        self._check_closed()
        return True

    def writable(self) -> bool:
        self._check_closed()
        return False

    def tell(self) -> int:
        self._check_closed()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # As io's files: an integer (1.5 or "5" is a TypeError, never a fractional position).
        offset, whence = operator.index(offset), operator.index(whence)
        with self._lock:
            return self._seek(offset, whence)

    def _seek(self, offset: int, whence: int) -> int:
        self._check_closed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        """Read up to ``len(b)`` bytes at the current position (fewer only at EOF)."""
        with self._lock:
            return self._readinto(b)


    def read(self, size: int | None = -1) -> bytes:
        if size is not None:
            size = operator.index(size)
        with self._lock:  # the size and the read at one position
            self._check_closed()
            if size is None or size < 0:
                size = max(0, self.size - self._pos)
            buf = read_buffer(min(size, max(0, self.size - self._pos)),
                              self._uri.redacted)
            n = self._readinto(buf)
        del buf[n:]
        return bytes(buf)

    def readall(self) -> bytes:
        return self.read(-1)

    def read1(self, size: int = -1) -> bytes:
        """As :meth:`read` (``io.BufferedIOBase``'s name, for code that asks for it);
        ``-1`` reads at most :data:`READ1_DEFAULT` bytes."""
        size = operator.index(size)
        return self.read(READ1_DEFAULT if size < 0 else size)

    def peek(self, size: int = 0) -> bytes:
        """Bytes at the current position without moving past them (at least one
        unless at EOF, at most :data:`READ1_DEFAULT`), as ``io.BufferedReader``."""
        size = operator.index(size)
        with self._lock:
            self._check_closed()
            pos = self._pos
            buf = bytearray(min(max(size, 1), READ1_DEFAULT, max(0, self.size - pos)))
            try:
                n = self._readinto(buf)
            finally:
                self._pos = pos
        del buf[n:]
        return bytes(buf)

    def readline(self, size: int | None = -1) -> bytes:
        """The bytes up to and including the next ``b"\\n"`` (at most ``size``;
        ``b""`` at EOF), as a binary file's; iteration and ``readlines`` use it.

        Read a chunk at a time, the position then set just past the line: io's
        own readline peeks and reads one byte at a time here (an unbuffered file),
        a minute for the lines of a 1 MB local file. The chunk is kept for the lines
        after it (as a buffered file keeps its buffer)."""
        size = -1 if size is None else operator.index(size)
        with self._lock:
            self._check_closed()
            start = self._pos
            line = bytearray()
            chunk = LINE_CHUNK
            try:
                while size < 0 or len(line) < size:
                    want = chunk if size < 0 else min(chunk, size - len(line))
                    at = start + len(line)
                    kept, kept_at = self._line_chunk
                    if kept_at <= at < kept_at + len(kept):
                        eof = False  # (short only where the chunk ends: read on)
                    else:
                        self._pos = at
                        buf = bytearray(want)
                        n = self._readinto(buf)
                        kept, kept_at, eof = bytes(buf[:n]), at, n < want  # (fewer: EOF)
                        self._line_chunk = (kept, kept_at)
                    off = at - kept_at
                    stop = min(off + want, len(kept))
                    if stop <= off:
                        break
                    end = kept.find(b"\n", off, stop)
                    if end >= 0:
                        line += kept[off: end + 1]
                        break
                    line += kept[off:stop]
                    if eof:
                        break
                    chunk = min(2 * chunk, READ1_DEFAULT)
            except BaseException:
                self._pos = start  # a read that failed moved nothing
                raise
            self._pos = start + len(line)  # past the line only, whatever more was read
        return bytes(line)

    def readinto1(self, b: Any) -> int:
        """As :meth:`readinto` (``io.BufferedIOBase``'s name)."""
        return self.readinto(b)

    def write(self, b: Any) -> int:
        raise UnsupportedOperationError("not writable: open the URI with mode 'wb' to write")

    def fileno(self) -> int:
        raise io.UnsupportedOperation(f"{type(self).__name__} has no file descriptor")


    def _check_closed(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
