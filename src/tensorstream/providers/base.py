"""The provider protocol: one small async ranged-read/atomic-write interface.

A provider is bound to one *location* (a filesystem, an HTTP origin, an S3
endpoint, a Redis server/db) and addresses objects inside it by ``path``
(see :meth:`tensorstream.uri.ParsedURI.path`).

Backends implement few methods: :meth:`Provider.stat`,
:meth:`Provider.readinto` and, where they can, :meth:`Provider.list`,
:meth:`Provider.open_writer`, :meth:`Provider.delete`. Everything else
(``read_range``, whole-object reads, retries, timeouts, resume, pinning,
metrics) is derived once, above all backends.

The version a read is pinned to (:class:`Pin`) is in :mod:`.pin`, the deadlines
of the operation running now (:class:`Deadline`) in :mod:`.deadline`; both are
importable from here.
"""

from __future__ import annotations

import abc
import contextvars
import dataclasses
import operator
import re
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Protocol

from ..errors import InvalidRangeError, UnsupportedOperationError
from ..headroom import read_buffer
from ..uri import redact_text
from .deadline import Deadline, current_deadline, report_progress
from .pin import Pin

__all__ = [
    "BodyStream",
    "Capabilities",
    "Deadline",
    "ObjectInfo",
    "Pin",
    "Provider",
    "ReadHints",
    "Writer",
    "check_range",
    "current_deadline",
    "display_listing",
    "listing_keeps_damaged",
    "report_progress",
]

#: True while a listing is only shown (``tensorstream ls``): a provider may then skip an
#: entry its server lies about, with a warning naming it. Elsewhere (``cp -r``, ``sync
#: --delete``) a listing without that entry would pass a part off as the whole: it fails.
display_listing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tensorstream_display_listing", default=False)

#: True while a listing's reader picks the entries it wants and fails the damaged ones it
#: picked by name (``cp -r``/``sync``, by their rules): a provider then gives an entry it
#: cannot make sense of (a damaged object) as ``ObjectInfo(path, 0, extra={"damaged":
#: error})`` instead of failing the whole listing. Such an entry is still an entry:
#: ``sync --delete`` keeps its copy.
listing_keeps_damaged: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tensorstream_listing_keeps_damaged", default=False)

#: ``read_range`` checks the object's size before allocating more than this many bytes.
CHECKED_READ_RANGE = 64 << 20


#: ``user:password@`` at the start of a path that has no scheme (an fsspec path).
_USERINFO_PASSWORD = re.compile(r"\A([^/@:]*):[^/@]*@")


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`Provider.stat` and :meth:`Provider.list` report about an object."""

    path: str
    size: int
    etag: str | None = None
    mtime: datetime | None = None
    version: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __repr__(self) -> str:
        # An HTTP path holds the URL's query: a presigned URL's signature must not be shown.
        # An fsspec path is its URI without the scheme, user info included (``u:pw@h/x``).
        shown = _USERINFO_PASSWORD.sub(r"\1:***@", redact_text(self.path), count=1)
        return (f"ObjectInfo(path={shown!r}, size={self.size!r}, "
                f"etag={self.etag!r}, mtime={self.mtime!r}, version={self.version!r})")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Which operations a provider supports, beyond the required ``stat`` and
    ``readinto``. An operation that is not declared fails in one place, the
    layer (:class:`tensorstream.layers.PolicyProvider`), with
    :class:`UnsupportedOperationError`; the conformance suite checks that every
    declared one works."""

    write: bool = False
    list: bool = False
    delete: bool = False
    #: The provider takes ``pin=`` on its reads and guarantees that every answer
    #: is of that version, with validators sent with the read itself (If-Match,
    #: If-Unmodified-Since, a generation) and what each answer reports (ETag,
    #: Last-Modified, total size) compared. Without it the layer pins by
    #: ``stat`` after each read (one extra request).
    pinned_reads: bool = False
    #: :meth:`Provider.readinto_blocking` works (worker threads, no event loop).
    blocking_reads: bool = False
    #: :meth:`Provider.open_range_blocking` works: one request whose body is
    #: read in order, straight into successive caller buffers (HTTP, S3).
    range_streams: bool = False
    # Accepted for one release (providers written before ReadHints); ignored.
    read: dataclasses.InitVar[bool | None] = None
    stat: dataclasses.InitVar[bool | None] = None
    inline_reads: dataclasses.InitVar[bool | None] = None
    serial_server: dataclasses.InitVar[bool | None] = None

    def __post_init__(self, read: bool | None, stat: bool | None,
                      inline_reads: bool | None, serial_server: bool | None) -> None:
        if inline_reads is not None or serial_server is not None or read is not None \
                or stat is not None:
            import warnings

            warnings.warn("Capabilities(read=, stat=, inline_reads=, serial_server=) are "
                          "gone: reads and stat are required of every provider, and the "
                          "tuning hints moved to Provider.read_hints (ReadHints)",
                          DeprecationWarning, stacklevel=3)


@dataclasses.dataclass(frozen=True)
class ReadHints:
    """How loaders should drive a provider (tuning only: never changes what works)."""

    #: Blocking reads are cheap enough to run inline in the reader's thread,
    #: without read-ahead (local files).
    inline: bool = False
    #: One server thread answers every request (Redis): parallel readers only
    #: queue behind each other there, so loaders default to one.
    serial_server: bool = False


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


def _byte_offset(name: str, value: Any) -> int:
    """``value`` as an int, or a TypeError naming the argument: ``operator.index`` alone said
    "'float' object cannot be interpreted as an integer", and took ``True`` for byte 1."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer byte offset, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer byte offset, got "
                        f"{type(value).__name__} {repr(value)[:40]}") from None


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

    # -- parts in any order (optional) -----------------------------------------
    def part_size_for(self, total: int, wanted: int) -> int | None:
        """The part size this writer takes for a ``total``-byte object when it
        can take parts out of order (:meth:`write_part`), near ``wanted``; ``None``
        (the default): only :meth:`write` in order."""
        return None

    async def write_part(self, index: int, data: memoryview, *, md5: bytes) -> None:
        """Store part ``index`` (bytes ``[index * part_size, ...)``; every part
        but the last is ``part_size`` long), concurrently with other parts, and
        check with the service that it holds exactly ``data``, whose MD5
        (``md5``, taken from the source's bytes as they arrived) is given. The
        caller may reuse ``data`` once this returns. Parts are committed by
        :meth:`commit_parts`; :meth:`write` is not mixed with this."""
        raise NotImplementedError

    async def commit_parts(self, count: int, *, sha256: str | None = None) -> None:
        """Publish the ``count`` parts written by :meth:`write_part` atomically.
        ``sha256`` (hex) is the whole object's, when the writer asked for it
        (:attr:`wants_sha256`)."""
        raise NotImplementedError

    #: :meth:`commit_parts` needs the sha256 of the whole object (in order).
    wants_sha256: bool = False

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
    #: How loaders should drive this provider (tuning only).
    read_hints: ClassVar[ReadHints] = ReadHints()
    #: Option names (keyword arguments) this provider understands.
    option_names: ClassVar[frozenset[str]] = frozenset()
    #: What an operation it does not declare (by capability flag: ``list``, ``write``,
    #: ``delete``) says instead of the generic message: user words, and what to use instead.
    unsupported_advice: ClassVar[Mapping[str, str]] = {}
    #: ``host:port`` its errors name before a path (``/k``) that alone does not say which
    #: server (HTTP); never user info or a query. None: the path alone.
    shown_origin: str | None = None

    # -- construction -------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def from_uri(cls, uri: Any, **options: Any) -> Provider:
        """Build a provider for the location of ``uri`` (a :class:`ParsedURI`)."""

    def shown_path(self, path: str) -> str:
        """``path`` as errors show it, secrets redacted. A provider whose paths carry
        no scheme but may carry user info (fsspec's) shows its URI instead: only a
        URI's user info is recognised as a secret."""
        return redact_text(path)

    # -- required -----------------------------------------------------------
    @abc.abstractmethod
    async def stat(self, path: str) -> ObjectInfo:
        """Size, ETag and mtime of an object; :class:`NotFoundError` if absent."""

    @abc.abstractmethod
    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """Fill ``buffer`` with the bytes at ``[offset, offset + len(buffer))``.

        Returns ``len(buffer)`` or raises: never a short read. A body broken
        part-way raises :class:`IncompleteReadError` whose ``received`` bytes
        at the start of ``buffer`` are valid, so the retry layer can resume;
        a provider that knows which version those bytes came from sets
        ``served`` (a :class:`Pin`) on the error, so the resumed read is pinned
        to it. ``pin`` is only passed to providers declaring
        ``capabilities.pinned_reads``: they raise :class:`ObjectChangedError`
        unless every answer is of that version (see :class:`Pin`).

        Deadlines: a provider whose waits can block must bound each by
        :func:`current_deadline` (``wait_bound()``) on its blocking path, and
        call :func:`report_progress` as bytes arrive when one read can take
        longer than the idle timeout; the timeout layer cuts off async
        attempts that do neither.
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
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """Synchronous :meth:`readinto` in the calling thread (``capabilities.blocking_reads``).

        Providers with range streams get it for free: one
        :meth:`open_range_blocking` read whole into ``buffer``."""
        if self.capabilities.range_streams:
            if offset < 0:
                raise InvalidRangeError(f"negative offset {offset}", service=self.service,
                                        path=self.shown_path(path))
            if not len(buffer):
                return 0
            body = self.open_range_blocking(path, offset, offset + len(buffer), pin=pin)
            return body.readinto(buffer)
        raise UnsupportedOperationError(
            f"{self.service} has no blocking reads", service=self.service, operation="read"
        )

    def open_range_blocking(
        self, path: str, start: int, end: int, *, pin: Pin | None = None
    ) -> BodyStream:
        """Request bytes ``[start, end)`` and return the body, to be read in order
        (``capabilities.range_streams``). Opening checks the answer (status,
        range, version with ``pin``) and raises like :meth:`readinto`; each
        body read bounds its waits by :func:`current_deadline` at that time."""
        raise UnsupportedOperationError(
            f"{self.service} has no range streams", service=self.service, operation="read"
        )

    def open_whole_blocking(self, path: str) -> tuple[ObjectInfo, BodyStream] | None:
        """What :meth:`stat` reports together with the body of bytes ``[0, size)``,
        from one request, for providers whose ``stat`` is a round trip of its
        own (``range_streams``). ``None``: not available for this object or
        provider; ask :meth:`stat`, whose answer (and errors) stay the reference."""
        return None

    async def delete(self, path: str) -> None:
        """Remove an object; :class:`NotFoundError` if absent."""
        raise UnsupportedOperationError(
            f"{self.service} does not support delete", service=self.service, operation="delete"
        )

    async def close(self) -> None:
        """Release connections and pools. Idempotent."""

    # -- derived ------------------------------------------------------------
    async def read_range(self, path: str, start: int, end: int, *,
                         pin: Pin | None = None) -> bytes:
        """Bytes ``[start, end)``; end is exclusive. Raises if past the end."""
        start, end = _byte_offset("start", start), _byte_offset("end", end)
        if start < 0 or end < start:
            raise InvalidRangeError(f"invalid range [{start}, {end})", path=self.shown_path(path))
        if end - start > CHECKED_READ_RANGE:
            # A large buffer is allocated only for bytes the object has: a range past its
            # end (a typo, a hostile length) raises here, not MemoryError or a swap storm.
            size = pin.size if pin is not None and pin.size is not None else (
                await self.stat(path)).size
            if end > size:
                raise InvalidRangeError(
                    f"range [{start}, {end}) is past the end of a {size}-byte object",
                    service=getattr(self, "service", None), operation="read",
                    path=self.shown_path(path))
        buf = read_buffer(end - start, self.shown_path(path))
        if buf:
            await self.readinto(path, start, memoryview(buf), pin=pin)
        return bytes(buf)

    async def __aenter__(self) -> Provider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
