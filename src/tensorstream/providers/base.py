"""The provider protocol: one small async ranged-read/atomic-write interface.

A provider is bound to one *location* (a filesystem, an HTTP origin, an S3
endpoint, a Redis server/db) and addresses objects inside it by ``path``
(see :meth:`tensorstream.uri.ParsedURI.path`).

Backends implement few methods: :meth:`Provider.stat`,
:meth:`Provider.readinto` and, where they can, :meth:`Provider.list`,
:meth:`Provider.open_writer`, :meth:`Provider.delete`. Everything else
(``read_range``, whole-object reads, retries, timeouts, resume, pinning,
metrics) is derived once, above all backends.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Protocol

from ..errors import InvalidRangeError, UnsupportedOperationError
from ..uri import redact_text

__all__ = ["BodyStream", "Capabilities", "ObjectInfo", "Provider", "Writer", "check_range"]


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`Provider.stat` and :meth:`Provider.list` report about an object."""

    path: str
    size: int
    etag: str | None = None
    mtime: datetime | None = None
    version: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a provider can do; unsupported operations fail in one place."""

    read: bool = True
    stat: bool = True
    write: bool = False
    list: bool = False
    delete: bool = False
    #: ``readinto(..., etag=...)`` is enforced by the server (If-Match / version).
    pinned_reads: bool = False
    #: :meth:`Provider.readinto_blocking` works (local files: the sync file object
    #: then reads in the caller's thread, with no I/O-thread hop and no copy).
    blocking_reads: bool = False
    #: Blocking reads are cheap enough to run inline in the reader's thread,
    #: without read-ahead (local files).
    inline_reads: bool = False
    #: One server thread answers every request (Redis): parallel readers only
    #: queue behind each other there, so loaders default to one.
    serial_server: bool = False
    #: :meth:`Provider.open_range_blocking` works: one request whose body is
    #: read in order, straight into successive caller buffers (HTTP, S3). On a
    #: fast link a sequential reader then costs one request per stream instead
    #: of one per piece.
    range_streams: bool = False


class BodyStream(Protocol):
    """The body of one ranged request, read in order (:meth:`Provider.open_range_blocking`)."""

    @property
    def position(self) -> int:
        """The offset of the next byte :meth:`readinto` returns."""
        ...

    @property
    def end(self) -> int:
        """The end of the requested range (exclusive)."""
        ...

    def readinto(self, buffer: memoryview) -> int:
        """Fill all of ``buffer`` with the next bytes or raise (like
        :meth:`Provider.readinto`: ``received`` on the error counts the valid
        bytes at the start of ``buffer``); the stream is closed after an error."""
        ...

    def close(self) -> None:
        """Drop the rest of the body. Idempotent."""
        ...


def check_range(size: int, start: int, end: int) -> None:
    """Raise :class:`InvalidRangeError` unless ``0 <= start <= end <= size``."""
    if start < 0 or end < start:
        raise InvalidRangeError(f"invalid range [{start}, {end})")
    if end > size:
        raise InvalidRangeError(f"range [{start}, {end}) is past the end of a {size}-byte object")


class Writer(abc.ABC):
    """An atomic writer: the object appears whole on :meth:`commit` or not at all.

    ``async with provider.open_writer(path) as w: await w.write(b)`` commits on
    normal exit and aborts on an exception.
    """

    @abc.abstractmethod
    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``; may buffer, but never holds more than a bounded amount."""

    @abc.abstractmethod
    async def commit(self) -> None:
        """Publish the object atomically. Idempotent after success."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Discard everything written (temp files, multipart uploads, chunks)."""

    async def __aenter__(self) -> Writer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.abort()


class Provider(abc.ABC):
    """Base class of all storage providers.

    Subclasses set :attr:`schemes` and :attr:`capabilities`, implement
    :meth:`from_uri` and the operations they support, and are registered
    with :func:`tensorstream.providers.registry.register` (one line).
    """

    #: URI schemes served by this provider, e.g. ``("http", "https")``.
    schemes: ClassVar[tuple[str, ...]] = ()
    #: Short name used in error messages and metrics, e.g. ``"s3"``.
    service: ClassVar[str] = "provider"
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: Option names (keyword arguments) this provider understands.
    option_names: ClassVar[frozenset[str]] = frozenset()

    # -- construction -------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def from_uri(cls, uri: Any, **options: Any) -> Provider:
        """Build a provider for the location of ``uri`` (a :class:`ParsedURI`)."""

    # -- required -----------------------------------------------------------
    @abc.abstractmethod
    async def stat(self, path: str) -> ObjectInfo:
        """Size, ETag and mtime of an object; :class:`NotFoundError` if absent."""

    @abc.abstractmethod
    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        """Fill ``buffer`` with the bytes at ``[offset, offset + len(buffer))``.

        Returns ``len(buffer)`` or raises: never a short read. With ``etag``,
        raises :class:`ObjectChangedError` when the object's ETag differs. A
        body broken part-way raises :class:`IncompleteReadError` whose
        ``received`` bytes at the start of ``buffer`` are valid, so the retry
        layer can resume.
        """

    # -- optional -----------------------------------------------------------
    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Yield objects whose path starts with ``prefix``, in sorted order."""
        raise UnsupportedOperationError(
            f"{self.service} does not support list", service=self.service, operation="list"
        )

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        """An atomic :class:`Writer` for ``path``."""
        raise UnsupportedOperationError(
            f"{self.service} does not support writes", service=self.service, operation="write"
        )

    def readinto_blocking(
        self, path: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        """Synchronous :meth:`readinto` in the calling thread (``capabilities.blocking_reads``).

        Providers with range streams get it for free: one
        :meth:`open_range_blocking` read whole into ``buffer``."""
        if self.capabilities.range_streams:
            if offset < 0:
                raise InvalidRangeError(f"negative offset {offset}", service=self.service,
                                        path=redact_text(path))
            if not len(buffer):
                return 0
            body = self.open_range_blocking(path, offset, offset + len(buffer), etag=etag)
            return body.readinto(buffer)
        raise UnsupportedOperationError(
            f"{self.service} has no blocking reads", service=self.service, operation="read"
        )

    def open_range_blocking(
        self, path: str, start: int, end: int, *, etag: str | None = None
    ) -> BodyStream:
        """Request bytes ``[start, end)`` and return the body, to be read in order
        (``capabilities.range_streams``). Opening checks the answer (status,
        range, ETag with ``etag``) and raises like :meth:`readinto`."""
        raise UnsupportedOperationError(
            f"{self.service} has no range streams", service=self.service, operation="read"
        )

    async def delete(self, path: str) -> None:
        """Remove an object; :class:`NotFoundError` if absent."""
        raise UnsupportedOperationError(
            f"{self.service} does not support delete", service=self.service, operation="delete"
        )

    async def close(self) -> None:
        """Release connections and pools. Idempotent."""

    # -- derived ------------------------------------------------------------
    async def read_range(self, path: str, start: int, end: int, *, etag: str | None = None) -> bytes:
        """Bytes ``[start, end)``; end is exclusive. Raises if past the end."""
        if start < 0 or end < start:
            raise InvalidRangeError(f"invalid range [{start}, {end})", path=path)
        buf = bytearray(end - start)
        if buf:
            await self.readinto(path, start, memoryview(buf), etag=etag)
        return bytes(buf)

    async def __aenter__(self) -> Provider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
