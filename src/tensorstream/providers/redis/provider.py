"""Redis provider (``redis://`` and ``rediss://``) on redis.asyncio with hiredis.

An object is a manifest hash plus generation-scoped chunk keys (see
:mod:`tensorstream.providers.redis.layout` and ``docs/redis.md``); reads
pipeline ``GETRANGE`` per chunk straight into the caller's buffer and fan
out over connections (and cluster nodes). Prefixes written by tensorizer's
``TensorDeserializer.to_redis`` and plain string keys are read too.

>>> with tensorstream.open("redis://user:pw@host:6379/model.tensors?db=1") as f:  # doctest: +SKIP
...     TensorDeserializer(f, device="cuda")
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import itertools
import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterable
from typing import Any, ClassVar

from ... import _loop
from ...config import VALIDATORS, CommonConfig, _flag
from ...errors import (
    ConfigurationError,
    IncompleteReadError,
    InsecureTLSWarning,
    InvalidRangeError,
    InvalidURIError,
    NotFoundError,
    ObjectChangedError,
    ProtocolError,
    TensorstreamError,
)
from ...uri import ParsedURI
from ..base import (
    Capabilities,
    Deadline,
    ObjectInfo,
    Pin,
    Provider,
    ReadHints,
    Writer,
    current_deadline,
    report_progress,
)
from .blocking import BATCH_BYTES, Batch, batches, calls, place
from .config import OPTIONS, RedisCredentials, resolve_redis_credentials
from .connection import BATCHES_IN_FLIGHT, RedisConnection
from .damaged import delete_damaged
from .layout import Layout, is_a_date, named_like_chunk
from .lister import Damaged, list_objects
from .lookup import key_bytes, look_up, scan_tensorizer
from .writer import DELETE_IF_GENERATION, RedisWriter

__all__ = ["DEFAULT_CHUNK_SIZE", "InsecureTLSWarning", "RedisProvider"]

log = logging.getLogger("tensorstream.redis")

DEFAULT_CHUNK_SIZE = 4 << 20
_MIN_CHUNK, _MAX_CHUNK = 1 << 10, 512 << 20
_LAYOUT_CACHE = 256
_TRUE = ("1", "true", "yes", "on")


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in _TRUE


class RedisProvider(RedisConnection, Provider):
    """Objects in one Redis database or cluster. Paths are key names."""

    schemes = ("redis", "rediss")
    service = "redis"
    capabilities: ClassVar[Capabilities] = Capabilities(
        write=True, list=True, delete=True, pinned_reads=True, blocking_reads=True,
    )
    read_hints: ClassVar[ReadHints] = ReadHints(serial_server=True)
    option_names = OPTIONS

    def __init__(
        self,
        host: str,
        port: int = 6379,
        *,
        tls: bool = False,
        db: int = 0,
        cluster: bool = False,
        credentials: RedisCredentials | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        config: CommonConfig | None = None,
        ca_bundle: str | None = None,
        insecure: bool = False,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        if client_key is not None and client_cert is None:  # as HTTP(S) and S3 say it
            raise ConfigurationError("client_key needs client_cert")
        if not _MIN_CHUNK <= chunk_size <= _MAX_CHUNK:
            raise ConfigurationError(
                f"redis_chunk_size must be between {_MIN_CHUNK} and {_MAX_CHUNK}, got {chunk_size}"
            )
        if cluster and db:
            raise ConfigurationError("Redis Cluster has only database 0; drop db/redis_db")
        super().__init__(host, port, tls=tls, db=db, cluster=cluster, credentials=credentials,
                         config=config, ca_bundle=ca_bundle, insecure=insecure,
                         client_cert=client_cert, client_key=client_key)
        self.chunk_size = chunk_size
        self._layouts: dict[str, Layout] = {}
        if self._insecure and tls:
            msg = (f"TLS certificate verification is disabled (insecure=True) for "
                   f"rediss://{host}:{port}; anyone on the path can read or alter the data")
            warnings.warn(msg, InsecureTLSWarning, stacklevel=4)
            log.warning(msg)

    @classmethod
    def from_uri(cls, uri: Any, *, config: CommonConfig | None = None,
                 **options: Any) -> RedisProvider:
        """Build from a parsed ``redis[s]://`` URI; options win over the URI, the URI over env."""
        parsed: ParsedURI = uri
        unknown = set(options) - cls.option_names
        if unknown:
            raise ConfigurationError(f"unknown Redis option(s): {', '.join(sorted(unknown))}")
        db = options.get("redis_db")
        if db is None:
            # the option's bounds and flags hold for the URI's too: ?db=99999999999999 failed
            # only at the server's SELECT, and ?cluster=maybe meant False
            db = VALIDATORS["redis_db"]("db in the URI", parsed.query.get("db", 0))
        try:
            db = int(str(db))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"redis_db must be an integer, got {db!r}") from exc
        cluster = options.get("redis_cluster")
        if cluster is None:
            cluster = _flag("cluster in the URI", parsed.query.get("cluster") or False)
        creds = resolve_redis_credentials(
            parsed, username=options.get("redis_username"), password=options.get("redis_password")
        )
        return cls(
            parsed.host or "localhost",
            parsed.port or 6379,
            tls=parsed.scheme == "rediss",
            db=db,
            cluster=_as_bool(cluster),
            credentials=creds,
            chunk_size=int(options.get("redis_chunk_size") or DEFAULT_CHUNK_SIZE),
            config=config,
            ca_bundle=options.get("ca_bundle"),
            insecure=_as_bool(options.get("insecure", False)),
            client_cert=options.get("client_cert"),
            client_key=options.get("client_key"),
        )

    def __repr__(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        kind = ", cluster" if self.cluster else f", db={self.db}"
        return f"RedisProvider('{scheme}://{self.host}:{self.port}'{kind}, {self._creds.describe()})"

    def __reduce__(self) -> Any:
        raise TypeError("RedisProvider holds credentials and cannot be pickled")
    # -- layout ---------------------------------------------------------------
    async def resolve(self, path: str) -> Layout:
        """Find the object at ``path``: manifest, plain string or tensorizer prefix."""
        layout = await look_up(self, path)
        self._remember(layout)
        return layout

    def _remember(self, layout: Layout) -> None:
        self._layouts.pop(layout.path, None)
        self._layouts[layout.path] = layout
        while len(self._layouts) > _LAYOUT_CACHE:
            self._layouts.pop(next(iter(self._layouts)))

    # -- Provider API -----------------------------------------------------------
    async def stat(self, path: str) -> ObjectInfo:
        return _info(await self.resolve(path))

    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        layout = self._layouts.get(path)
        if layout is None or not _still_valid(layout, pin):
            layout = await self.resolve(path)
            # Every manifest has an ETag: a version pinned without one (a plain string,
            # a tensorizer prefix) that is now a manifest was replaced, whatever its size
            # (read on, a plain string's first bytes were followed by the new object's).
            if pin is not None and layout_version(layout).etag != pin.etag:
                raise ObjectChangedError(f"Redis object {path!r} was replaced while being read")
        _check_size(layout, pin)
        want = _checked_length(layout, offset, buffer)
        if want == 0:
            return 0
        # Batches are built as a fetcher takes them: at most BATCHES_IN_FLIGHT are held
        # (all of a read's were, ~320 MB for 1 GiB of 1 KiB chunks). Only each taken
        # batch's size and whether it arrived are kept, for the bytes received in order.
        planned = enumerate(batches(layout, offset, want))
        sizes: list[int] = []
        done: list[bool] = []

        async def fetcher() -> None:
            for i, batch in planned:  # (shared: each takes the next batch)
                sizes.append(sum(e[2] for e in batch))
                done.append(False)
                await self._fetch(layout, batch, buffer)
                done[i] = True
                report_progress()

        try:
            await _all_or_nothing([fetcher() for _ in range(
                min(BATCHES_IN_FLIGHT, -(-want // BATCH_BYTES)))])
        except TensorstreamError as exc:
            received = 0
            for ok, size in zip(done, sizes, strict=True):
                if not ok:
                    break
                received += size
            if exc.temporary and received:
                broken = IncompleteReadError(
                    f"Redis read broken after {received} bytes: {exc.message}", received=received)
                broken.served = layout_version(layout)
                raise broken from exc
            raise
        return want

    async def _fetch(self, layout: Layout, batch: Batch, buffer: memoryview) -> None:
        planned = calls(batch, mget=not self.cluster and layout.kind == "manifest")
        results = await self.pipeline([(name, args) for name, args, _ in planned])
        for call, data in zip(planned, results, strict=True):
            place(layout, call, data, buffer)

    def readinto_blocking(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """:meth:`readinto` in the calling thread (a worker of the read-ahead):
        a synchronous client, no event loop. Cluster reads hop to the I/O loop."""
        layout = self._layouts.get(path)
        deadline = current_deadline()
        if (self.cluster or layout is None or not _still_valid(layout, pin)
                or (deadline is not None and deadline.at is not None)):
            # On the I/O loop, where a total deadline can cut a read short (redis-py's
            # blocking reads only bound each receive: a trickle would never end).
            return self._on_loop(self.readinto(path, offset, buffer, pin=pin), deadline, path)
        _check_size(layout, pin)
        want = _checked_length(layout, offset, buffer)
        if want == 0:
            return 0
        return self._blocking_reader().readinto(layout, offset, buffer)

    def _on_loop(self, read: Coroutine[Any, Any, int], deadline: Deadline | None,
                 path: str) -> int:
        """``read`` run on the I/O loop for a worker of the read-ahead, where
        :meth:`close` (its reader's close) stops it (see ``_stop_reads``)."""
        async def tracked() -> int:
            task = asyncio.current_task()
            assert task is not None
            self._reading.add(task)
            try:
                return await _bounded(read, deadline, path)
            finally:
                self._reading.discard(task)

        try:
            return _loop.run_sync(tracked())
        except concurrent.futures.CancelledError:
            if not self._reads_stopped:
                raise
            raise OSError("reader was closed") from None  # (never retried)

    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        return self._list(prefix)

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        for layout in await list_objects(self, prefix):
            yield (ObjectInfo(layout.path, 0, extra={"damaged": layout.error})
                   if isinstance(layout, Damaged) else _info(layout))

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        if named_like_chunk(path):
            raise InvalidURIError(
                f"Redis key {path!r} is named like a chunk of the object "
                f"{path.rsplit(':', 2)[0]!r} (K:<16 hex digits>:<offset>), which listings "
                "leave out beside that object: give it another name")
        # mtime=: a copy's source's date (sync compares it with the source's next one,
        # as a local copy carries it), within the years a manifest's date may name.
        mtime = kwargs.get("mtime")
        if mtime is not None and not is_a_date(mtime):
            mtime = None
        return RedisWriter(self, path, chunk_size=self.chunk_size, mtime=mtime)

    async def delete(self, path: str) -> None:
        try:
            layout = await self.resolve(path)
        except ProtocolError as exc:
            # damaged (no lookup makes sense of it): its own keys go, else nothing could
            await delete_damaged(self, path, exc)
            return
        except NotFoundError:
            # The chunks a manifest that is gone left behind (never an object):
            # removed with the name they were written under, else nothing could.
            _, leftover = await scan_tensorizer(self, path)
            if not leftover:
                raise
            self._layouts.pop(path, None)
            await self.delete_keys(leftover)
            return
        self._layouts.pop(path, None)
        if layout.kind == "manifest":
            # Drop the manifest first (readers then see "not found", never a partial object).
            async def drop() -> int:
                return int(await self.client().eval(
                    DELETE_IF_GENERATION, 1, key_bytes(path), layout.generation))

            if not await self._guard(drop):
                raise ObjectChangedError(f"Redis object {path!r} was replaced during delete")
        elif layout.kind == "string":
            await self.pipeline([("delete", (key_bytes(path),))])
            return
        await self.delete_keys(layout.chunk_keys())

    async def delete_keys(self, keys: Iterable[bytes]) -> None:
        """Delete ``keys``, 10,000 a round trip: ``keys`` may be a generator, never
        held whole. One ``DEL`` per 1000 keys on one server (a ``DEL`` per key was
        most of the work with small chunks); one per key on a cluster, where the
        keys of one ``DEL`` must share a hash slot."""
        it = iter(keys)
        while batch := builtins.list(itertools.islice(it, 10_000)):
            if self.cluster:
                await self.pipeline([("delete", (k,)) for k in batch])
            else:
                await self.pipeline([("delete", tuple(batch[i: i + 1000]))
                                     for i in range(0, len(batch), 1000)])


def _checked_length(layout: Layout, offset: int, buffer: memoryview) -> int:
    """``len(buffer)``, or :class:`InvalidRangeError` if the range leaves the object."""
    want = len(buffer)
    if offset < 0 or offset + want > layout.size:
        raise InvalidRangeError(
            f"range [{offset}, {offset + want}) is past the end of a {layout.size}-byte object"
        )
    return want


def _info(layout: Layout) -> ObjectInfo:
    from datetime import datetime, timezone

    mtime = (datetime.fromtimestamp(layout.mtime, tz=timezone.utc)
             if layout.mtime is not None else None)
    extra: dict[str, Any] = {"layout": layout.kind}
    if layout.checksum:
        extra["checksum"] = layout.checksum
    # Only a manifest has a version (its generation). A tensorizer layout's
    # identity (its keys and their sizes) survives a replacement by an object
    # of the same shape, so it is no ETag: such objects are pinned by size only.
    etag = layout.etag if layout.kind == "manifest" else None
    if layout.kind == "tensorizer":
        extra["layout_id"] = layout.etag
    return ObjectInfo(path=layout.path, size=layout.size, etag=etag, mtime=mtime,
                      version=layout.generation or None, extra=extra)


def _still_valid(layout: Layout, pin: Pin | None) -> bool:
    """Whether the cached ``layout`` may serve a read pinned to ``pin``: the pinned
    generation, or (tensorizer layouts, which have none) the pinned size; an
    unpinned read, or a plain string (cheap to look up), resolves afresh."""
    if pin is None:
        return False
    if pin.etag is not None:
        return layout.etag == pin.etag
    return layout.kind == "tensorizer" and layout.size == pin.size


async def _bounded(read: Awaitable[int], deadline: Deadline | None, path: str) -> int:
    """``await read``, given up when ``deadline`` (the caller's thread's) passes."""
    if deadline is None or deadline.at is None:
        return await read
    try:
        return await asyncio.wait_for(read, max(deadline.remaining() or 0.0, 0.001))
    except (asyncio.TimeoutError, TimeoutError) as exc:
        if isinstance(exc, TensorstreamError):
            raise
        raise deadline.error(service="redis", path=path) from None


def layout_version(layout: Layout) -> Pin:
    """The version of a layout's bytes: a manifest's generation, else the size alone."""
    return Pin(size=layout.size, etag=layout.etag if layout.kind == "manifest" else None)


def _check_size(layout: Layout, pin: Pin | None) -> None:
    if pin is not None:
        pin.check(Pin(size=layout.size), service="redis", path=layout.path)


async def _all_or_nothing(coros: list[Awaitable[None]]) -> None:
    """Await all; on the first failure (or cancellation) cancel the rest and re-raise."""
    if len(coros) == 1:
        await coros[0]
        return
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
