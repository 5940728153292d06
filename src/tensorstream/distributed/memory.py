"""The bytes of an object a load needs, in memory, as a seekable file.

After a group load's exchange every rank holds the bytes the load needs (a
:class:`~.plan.Layout` of the object: its headers and the tensors kept) in one
host buffer; :class:`MemorySource` is the file tensorizer then reads, so
parsing, ``verify_hash``, decryption and ``filter_func`` behave exactly as in
a load from storage. Reopened for parallel readers by
:mod:`tensorstream.tensorizer.hook` (a view of the same buffer, no copy).
"""

from __future__ import annotations

import io
import threading
from typing import Any

from .plan import Layout

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
    With a ``layout`` the buffer holds only its spans of an object of ``size``
    bytes (a filtered load's headers and tensors): a read of any other byte
    raises rather than inventing it.
    """

    def __init__(self, buffer: Any, name: str, *, origin: list[Any] | None = None,
                 arrival: Arrival | None = None, layout: Layout | None = None,
                 size: int | None = None) -> None:
        super().__init__()
        self._owner = buffer  # keeps the memory alive while views of it are read
        self._view = memoryview(buffer).cast("B")
        self._layout = layout
        self._size = len(self._view) if size is None else size
        self._pos = 0
        self.name = name
        self.origin = list(origin or [])
        #: Set while the bytes are still arriving (a group load's exchange) ...
        self.arrival = arrival
        #: ... by this exchange (``join()`` waits for it and raises its error).
        self.exchange: Any = None

    @property
    def size(self) -> int:
        return self._size

    def reopen(self, begin: int | None = None) -> MemorySource:
        """Another file over the same bytes (no copy), positioned at ``begin``."""
        other = MemorySource(self._owner, self.name, origin=self.origin, arrival=self.arrival,
                             layout=self._layout, size=self._size)
        other.exchange = self.exchange
        other._pos = begin or 0
        return other

    def _extent(self) -> int:
        return self._size

    def _copy(self, out: memoryview, end: int) -> int:
        """Copy bytes ``[pos, end)`` into ``out``; move on past them."""
        start = self._pos
        if end <= start:
            return 0
        if self.arrival is not None:
            self.arrival.wait(end)
        if self._layout is None:
            out[: end - start] = self._view[start:end]
        else:
            done = 0
            for at, n in self._layout.runs(start, end):
                out[done : done + n] = self._view[at : at + n]
                done += n
        self._pos = end
        return end - start

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        return self._copy(out, min(self._size, self._pos + len(out)))

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        data = bytearray(max(0, end - self._pos))
        self._copy(memoryview(data), end)
        return bytes(data)

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
        self._layout = None
        self._size = 0

    def close(self) -> None:
        self.release()  # drop the buffer (the exchange's host copy)
        super().close()
