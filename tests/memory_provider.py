"""An in-memory object store for tests (``memtest://bucket/key``): sorted listings, atomic writes.

A small real provider registered through the public ``tensorstream.register`` API: it exercises
the sequential-writer path and can list hostile keys that no local tree can produce.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from tensorstream.errors import NotFoundError, PermissionDeniedError
from tensorstream.providers.base import Capabilities, ObjectInfo, Pin, Provider, Writer, check_range


class MemReads(Provider):
    """Reads of objects held in memory: ``store`` (path -> bytes; each subclass its own)."""

    store: ClassVar[dict[str, bytes]] = {}

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> MemReads:  # (typing.Self is 3.11+)
        return cls()

    async def stat(self, path: str) -> ObjectInfo:
        if path not in self.store:
            raise NotFoundError(f"no such object: {path}")
        data = self.store[path]
        return ObjectInfo(path, len(data), hashlib.md5(data).hexdigest())

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        info = await self.stat(path)
        check_range(info.size, offset, offset + len(buffer))
        self.before_read(path, offset + len(buffer))
        buffer[:] = self.store[path][offset: offset + len(buffer)]
        return len(buffer)

    def before_read(self, path: str, end: int) -> None:
        """Called before a read of ``path`` up to ``end`` is served: raise to fail it."""


class MemProvider(MemReads):
    """An in-memory object store (``memtest://bucket/key``), sorted listings, atomic writes."""

    schemes = ("memtest",)
    service = "memtest"
    capabilities: ClassVar[Capabilities] = Capabilities(write=True, list=True, delete=True)
    store: ClassVar[dict[str, bytes]] = {}
    #: Flip one byte of every object written (a broken backend, for verification tests).
    corrupt_writes: ClassVar[bool] = False
    #: Refuse every delete (a destination the copy cannot remove).
    refuse_deletes: ClassVar[bool] = False
    #: A listing breaks off with "not found" after this many entries (a later page
    #: answered 404, by a gateway or a bucket deleted mid-listing); None: never.
    list_fails_after: ClassVar[int | None] = None
    #: ... only from the listing after this many whole ones (the copy's listing
    #: whole, ``sync --delete``'s own broken off).
    whole_lists_first: ClassVar[int] = 0


    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        fails_after = None if MemProvider.whole_lists_first else self.list_fails_after
        MemProvider.whole_lists_first = max(0, MemProvider.whole_lists_first - 1)
        for n, path in enumerate(sorted(p for p in self.store if p.startswith(prefix))):
            if fails_after is not None and n >= fails_after:
                raise NotFoundError(f"the next page of {prefix!r} answered 404")
            yield await self.stat(path)

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        return _MemWriter(self, path)

    async def delete(self, path: str) -> None:
        if self.refuse_deletes:
            raise PermissionDeniedError(f"deletes are refused here: {path}")
        if self.store.pop(path, None) is None:
            raise NotFoundError(f"no such object: {path}")

class _MemWriter(Writer):
    def __init__(self, owner: MemProvider, path: str) -> None:
        self.owner, self.path, self.parts = owner, path, bytearray()

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self.parts += data

    async def commit(self) -> None:
        data = bytearray(self.parts)
        if MemProvider.corrupt_writes and data:
            data[len(data) // 2] ^= 0xFF
        self.owner.store[self.path] = bytes(data)

    async def abort(self) -> None:
        self.parts.clear()
