"""The complete bytes of an object, in memory, as a seekable file.

After a group load's exchange every rank holds the object's bytes (or the
parts a load needs) in one host buffer; :class:`MemorySource` is the file
tensorizer then reads, so parsing, ``verify_hash``, decryption and
``filter_func`` behave exactly as in a load from storage. Reopened for
parallel readers by :mod:`tensorstream.tensorizer.hook` (a view of the same
buffer, no copy).
"""

from __future__ import annotations

import io
from typing import Any

__all__ = ["MemorySource"]


class MemorySource(io.RawIOBase):
    """A read-only, seekable file over ``buffer`` (any object with a byte view).

    ``name`` is the redacted URI the bytes came from; ``origin`` holds the
    readers that fetched this rank's share from storage (for load statistics).
    """

    def __init__(self, buffer: Any, name: str, *, origin: list[Any] | None = None) -> None:
        super().__init__()
        self._owner = buffer  # keeps the memory alive while views of it are read
        self._view = memoryview(buffer).cast("B")
        self._pos = 0
        self.name = name
        self.origin = list(origin or [])

    @property
    def size(self) -> int:
        return len(self._view)

    def reopen(self, begin: int | None = None) -> MemorySource:
        """Another file over the same bytes (no copy), positioned at ``begin``."""
        other = MemorySource(self._owner, self.name, origin=self.origin)
        other._pos = begin or 0
        return other

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence!r}")
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = bytes(self._view[self._pos : max(self._pos, end)])
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an in-memory source has no file descriptor")

    def release(self) -> None:
        """Drop the bytes (an eager load has built its tensors): later reads see an
        empty file, which the deserializer's checks would report."""
        self._view = memoryview(b"")
        self._owner = None

    def close(self) -> None:
        self._view = memoryview(b"")  # drop the buffer (the exchange's host copy)
        self._owner = None
        super().close()
