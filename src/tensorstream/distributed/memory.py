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
import threading
from typing import Any

__all__ = ["Arrival", "MemorySource", "PositionedFile"]


class Arrival:
    """How far the bytes of a buffer being filled in file order have arrived.

    The exchange calls :meth:`advance` as broadcasts complete; a reader of
    ``[pos, end)`` waits (:meth:`wait`) until ``end`` has arrived, so tensorizer
    builds the first tensors while later shares are still on the wire. A failed
    exchange (:meth:`fail`) wakes every waiting reader with its error.
    """

    def __init__(self, start: int, total: int) -> None:
        self._lock = threading.Condition()
        self._upto = start
        self._total = total
        self._error: BaseException | None = None

    def advance(self, upto: int) -> None:
        with self._lock:
            self._upto = max(self._upto, upto)
            self._lock.notify_all()

    def finish(self) -> None:
        self.advance(self._total)

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self._error = error
            self._lock.notify_all()

    def wait(self, end: int) -> None:
        with self._lock:
            while self._upto < end and self._error is None:
                self._lock.wait(1.0)
            if self._upto < end and self._error is not None:
                raise self._error




class PositionedFile(io.RawIOBase):
    """A read-only raw file that keeps its own position over ``_extent()`` bytes:
    the seek/tell plumbing the group's file sources share."""

    _pos = 0

    def _extent(self) -> int:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._extent()}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence!r}")
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos


class MemorySource(PositionedFile):
    """A read-only, seekable file over ``buffer`` (any object with a byte view).

    ``name`` is the redacted URI the bytes came from; ``origin`` holds the
    readers that fetched this rank's share from storage (for load statistics).
    """

    def __init__(self, buffer: Any, name: str, *, origin: list[Any] | None = None,
                 arrival: Arrival | None = None) -> None:
        super().__init__()
        self._owner = buffer  # keeps the memory alive while views of it are read
        self._view = memoryview(buffer).cast("B")
        self._pos = 0
        self.name = name
        self.origin = list(origin or [])
        #: Set while the bytes are still arriving (a group load's exchange) ...
        self.arrival = arrival
        #: ... by this exchange (``join()`` waits for it and raises its error).
        self.exchange: Any = None

    @property
    def size(self) -> int:
        return len(self._view)

    def reopen(self, begin: int | None = None) -> MemorySource:
        """Another file over the same bytes (no copy), positioned at ``begin``."""
        other = MemorySource(self._owner, self.name, origin=self.origin, arrival=self.arrival)
        other.exchange = self.exchange
        other._pos = begin or 0
        return other

    def _extent(self) -> int:
        return len(self._view)

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        if self.arrival is not None:
            self.arrival.wait(self._pos + n)
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        if self.arrival is not None:
            self.arrival.wait(end)
        data = bytes(self._view[self._pos : max(self._pos, end)])
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an in-memory source has no file descriptor")

    def join_exchange(self) -> None:
        """Wait until every byte has arrived; raise the exchange's error if it failed."""
        if self.exchange is not None:
            self.exchange.join()

    def release(self) -> None:
        """Drop the bytes (an eager load has built its tensors): later reads see an
        empty file, which the deserializer's checks would report."""
        self._view = memoryview(b"")
        self._owner = None

    def close(self) -> None:
        self._view = memoryview(b"")  # drop the buffer (the exchange's host copy)
        self._owner = None
        super().close()
