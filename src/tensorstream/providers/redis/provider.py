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
import contextlib
import itertools
import logging
import os
import ssl
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, ClassVar, TypeVar

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry as BlockingRetry

from ... import _loop
from ..._client_cert import load_client_cert
from ...config import VALIDATORS, CommonConfig, _flag, split_options
from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    IncompleteReadError,
    InsecureTLSWarning,
    InvalidRangeError,
    NotFoundError,
    ObjectChangedError,
    ProtocolError,
    TensorstreamError,
)
from ...readahead._memcopy import copy_into
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
from .blocking import BlockingRedisReader, batches, check_reply
from .config import OPTIONS, RedisCredentials, resolve_redis_credentials
from .errors import (
    REDIS_ERRORS,
    closed_by_server,
    map_redis_error,
    plain_text_instead_of_tls,
    tls_instead_of_plain_text,
)
from .layout import (
    Layout,
    escape_glob,
    is_staged_chunk,
    parse_manifest,
    string_layout,
    tensorizer_layout,
)
from .lister import list_objects
from .width import RETRY_IDLE, Width
from .writer import DELETE_IF_GENERATION, RedisWriter

__all__ = ["DEFAULT_CHUNK_SIZE", "InsecureTLSWarning", "RedisProvider"]

log = logging.getLogger("tensorstream.redis")
T = TypeVar("T")

DEFAULT_CHUNK_SIZE = 4 << 20
_MIN_CHUNK, _MAX_CHUNK = 1 << 10, 512 << 20
#: A readinto's pipelines (``batches``) run a few at a time, so one huge read
#: does not serialise on one socket.
_BATCHES_IN_FLIGHT = 4
_LAYOUT_CACHE = 256
#: How long ``close`` waits for a client of another (running) loop to close.
_CLOSE_ELSEWHERE_S = 5.0
_TRUE = ("1", "true", "yes", "on")


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in _TRUE


def key_bytes(path: str) -> bytes:
    """Redis key for an object path (UTF-8; undecodable bytes round-trip)."""
    return path.encode("utf-8", "surrogateescape")


class RedisProvider(Provider):
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
        if not _MIN_CHUNK <= chunk_size <= _MAX_CHUNK:
            raise ConfigurationError(
                f"redis_chunk_size must be between {_MIN_CHUNK} and {_MAX_CHUNK}, got {chunk_size}"
            )
        if cluster and db:
            raise ConfigurationError("Redis Cluster has only database 0; drop db/redis_db")
        self.host, self.port, self.tls, self.db, self.cluster = host, port, tls, db, cluster
        self._tls_answered = False  # set once a TLS call got an answer
        self._answered = False  # set once a plain-text call got one
        self.chunk_size = chunk_size
        self._creds = credentials or RedisCredentials()
        self._config = config or split_options({})[0]
        if tls and client_cert is not None:  # (redis-py loads it on each connect: a bad
            # pair was retried as a connection failure, an encrypted key prompted)
            load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), client_cert, client_key)
        self._tls_files = (ca_bundle, client_cert, client_key)
        self._insecure = bool(insecure)
        #: One client per event loop: reads hop between the caller's loop and the I/O
        #: loop (``readinto_blocking``), and a client (its connections, a cluster's
        #: slot map) belongs to the loop it was made on.
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._clients_pid = os.getpid()  # (a forked child's copies belong to no loop of its own)
        self._blocking: BlockingRedisReader | None = None
        #: how many interactions run at once (both clients): narrowed by a server
        #: refusing connections for its maxclients
        self._width = Width()
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

    # -- connection -----------------------------------------------------------
    def _client_kwargs(self, *, blocking: bool = False) -> dict[str, Any]:
        """Connection settings for an asyncio client, or a blocking one with ``blocking``."""
        t = self._config.timeouts
        # Each client flavour takes its own Retry class (redis-py >= 8.2 warns otherwise).
        no_retries = BlockingRetry(NoBackoff(), 0) if blocking else AsyncRetry(NoBackoff(), 0)
        kw: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "username": self._creds.username.value if self._creds.username else None,
            "password": self._creds.password.value if self._creds.password else None,
            "socket_connect_timeout": t.connect,
            "socket_timeout": t.idle,
            # Retries live in tensorstream's policy layer only.
            "retry": no_retries,
            # Every concurrent read may pipeline _BATCHES_IN_FLIGHT batches at once;
            # the pool must never run dry ("Too many connections" is not retried).
            "max_connections": self._config.transfer.concurrency * _BATCHES_IN_FLIGHT + 8,
        }
        if self.tls:
            ca, cert, key = self._tls_files
            kw.update(
                ssl=True,
                ssl_ca_certs=ca,
                ssl_certfile=cert,
                ssl_keyfile=key,
                ssl_cert_reqs="none" if self._insecure else "required",
                ssl_check_hostname=not self._insecure,
            )
        return kw

    def client(self) -> Any:
        """The redis.asyncio client for the running loop (created on first use)."""
        loop = asyncio.get_running_loop()
        if self._clients_pid != os.getpid():
            self._clients, self._clients_pid = {}, os.getpid()
        client = self._clients.get(loop)
        if client is None:
            # (one replaced on each hop between loops was dropped unclosed: its pooled
            # connections leaked, a cluster's printed "Unclosed RedisCluster client"
            # at the end of a cp, and every hop paid a new cluster's slot discovery)
            for gone in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[gone]
            kw = self._client_kwargs()
            client = RedisCluster(**kw) if self.cluster else aredis.Redis(db=self.db, **kw)
            self._clients[loop] = client
        return client

    async def _guard(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis interaction, mapping its errors (the only mapping point),
        within the width the server allows (:mod:`.width`): one it refused for its
        maxclients runs again once a connection of this provider is free."""
        idle_dropped = False
        while True:
            async with self._width.slot():
                try:
                    result = await self._guard_once(fn)
                    self._width.went_well()
                    return result
                except TensorstreamError as err:
                    step = self._width.after_failure(err, idle_dropped=idle_dropped)
            if step == RETRY_IDLE:
                await self._drop_idle()
                idle_dropped = True

    async def _drop_idle(self) -> None:
        """Close this provider's idle connections (both clients', every loop's):
        held for nothing, they may be the connections the server has no more of."""
        if self._blocking is not None:
            self._blocking.drop_idle()
        here = asyncio.get_running_loop()
        for loop, client in list(self._clients.items()):
            pool = getattr(client, "connection_pool", None)  # (a cluster's are per node)
            if pool is None:
                continue
            if loop is here:
                await pool.disconnect(inuse_connections=False)
            elif loop.is_running():
                done = asyncio.run_coroutine_threadsafe(
                    pool.disconnect(inuse_connections=False), loop)
                with contextlib.suppress(*REDIS_ERRORS):
                    await asyncio.wait_for(asyncio.wrap_future(done), _CLOSE_ELSEWHERE_S)

    def _drop_idle_blocking(self) -> None:
        """:meth:`_drop_idle` from a blocking reader's thread (on the I/O loop)."""
        with contextlib.suppress(*REDIS_ERRORS):
            _loop.run_sync(self._drop_idle())

    async def _guard_once(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            if self.tls and not self._tls_answered:
                result = await self._first_tls_call(fn)
                self._tls_answered = True
                return result
            result = await fn()
            self._answered = True
            return result
        except REDIS_ERRORS as exc:
            err = map_redis_error(exc, who=self._creds.describe(looked_in=True),
                                  secrets=self._creds.secrets())
            if (not self.tls and not self._answered and closed_by_server(exc)
                    and await tls_instead_of_plain_text(self.host, self.port)):
                # A TLS-only port drops a plain-text client at its first bytes: "connection
                # reset by peer", retried as if the server were restarting.
                err = ConnectionFailedError(
                    f"{self.host}:{self.port} speaks TLS, not plain-text Redis: use rediss:// "
                    "instead of redis:// (with ca_bundle=<file> if its CA is private)")
                err.temporary = False
            raise err from exc

    async def _first_tls_call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """The first call over rediss://: when it has no answer after a second, check
        whether the port speaks plain-text Redis (a TLS client there waits for a
        handshake reply that never comes, until its connect timeout, five times)."""
        call = asyncio.ensure_future(fn())
        try:
            done, _ = await asyncio.wait({call}, timeout=1.0)
            if not done and await plain_text_instead_of_tls(self.host, self.port):
                err = ConnectionFailedError(
                    f"{self.host}:{self.port} speaks plain-text Redis, not TLS: use redis:// "
                    "instead of rediss://")
                err.temporary = False  # retrying the handshake cannot help
                raise err
            return await call
        finally:
            if not call.done():
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)

    async def pipeline(self, calls: builtins.list[tuple[str, tuple[Any, ...]]],
                       raise_on_error: bool = True) -> builtins.list[Any]:
        """Run ``[(command_method, args), ...]`` in one non-transactional pipeline."""
        if not calls:
            return []

        async def run() -> list[Any]:
            pipe = self.client().pipeline(transaction=False)
            for name, args in calls:
                getattr(pipe, name)(*args)
            return list(await pipe.execute(raise_on_error=raise_on_error))

        return await self._guard(run)

    async def close(self) -> None:
        blocking, self._blocking = self._blocking, None
        if blocking is not None:
            blocking.close()
        clients, self._clients = self._clients, {}
        here = asyncio.get_running_loop()
        forked = self._clients_pid != os.getpid()
        for loop, client in clients.items():
            if loop is here and not forked:
                await client.aclose()
            elif loop.is_running() and not forked:  # closed on its own loop (the I/O loop's, say)
                done = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(done), _CLOSE_ELSEWHERE_S)
                except REDIS_ERRORS:  # (a timeout included)
                    log.debug("closing a Redis client on another loop failed", exc_info=True)

    async def bulk_limit(self) -> int | None:
        """The server's ``proto-max-bulk-len`` (the longest value it takes), or ``None``
        where ``CONFIG GET`` is refused, renamed or answered oddly."""
        try:
            reply = await self.client().config_get("proto-max-bulk-len")
        except REDIS_ERRORS:
            return None
        try:
            return int(reply["proto-max-bulk-len"])
        except (KeyError, TypeError, ValueError):
            return None

    # -- layout ---------------------------------------------------------------
    async def scan(self, match: str) -> builtins.list[bytes]:
        """Every key matching the glob ``match`` (SCAN on every primary; never KEYS)."""
        async def run() -> list[bytes]:
            client = self.client()
            if self.cluster:  # (one cursor per node: redis-py walks them)
                return [k async for k in client.scan_iter(match=match, count=1000)]
            keys: list[bytes] = []
            cursor, given = 0, set()
            while True:
                cursor, batch = await client.scan(cursor=cursor, match=match, count=1000)
                keys.extend(batch)
                if not cursor:
                    return keys
                if cursor in given:
                    # A server answering the same cursor forever: scanning on would never
                    # end, and the keys it repeats would pile up in memory meanwhile.
                    raise ProtocolError(f"Redis SCAN loops: cursor {cursor} came back while "
                                        f"listing {match!r}")
                given.add(cursor)

        return await self._guard(run)

    async def resolve(self, path: str) -> Layout:
        """Find the object at ``path``: manifest, plain string or tensorizer prefix."""
        key = key_bytes(path)
        kind, fields, length = await self.pipeline(
            [("type", (key,)), ("hgetall", (key,)), ("strlen", (key,))], raise_on_error=False
        )
        for reply in (kind, fields, length):
            if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
                raise map_redis_error(reply, who=self._creds.describe(looked_in=True),
                                      secrets=self._creds.secrets()) from reply
        if isinstance(kind, bytes):
            kind = kind.decode()
        if kind == "hash" and isinstance(fields, dict) and fields:
            layout = parse_manifest(path, fields)
        elif kind == "string" and isinstance(length, int):
            layout = string_layout(path, length)
        elif kind in ("none", None) or (kind == "hash" and not fields):
            layout = await self._resolve_tensorizer(path)
        else:
            raise NotFoundError(f"key {path!r} holds a Redis {kind}, not an object")
        self._remember(layout)
        return layout

    async def _resolve_tensorizer(self, path: str) -> Layout:
        layout, leftover = await self._scan_tensorizer(path)
        if layout is None:
            why = ""
            if leftover:
                why = (f"; {len(leftover)} chunk(s) of a tensorstream object remain under "
                       f"{path!r}:<generation>:<offset> with no manifest naming them (evicted "
                       "by maxmemory-policy, or a delete or commit was interrupted): "
                       "'tensorstream rm' removes them")
            raise NotFoundError(f"no such Redis object: {path!r}{why}")
        return layout

    async def _scan_tensorizer(self, path: str) -> tuple[Layout | None, builtins.list[bytes]]:
        """The tensorizer prefix at ``path`` (or ``None``), and the persistent chunks
        of a tensorstream object whose manifest is gone (never part of it)."""
        keys = await self.scan(escape_glob(path) + ":*")
        answers = await self.pipeline([("strlen", (k,)) for k in keys]
                                      + [("pttl", (k,)) for k in keys])
        sizes, ttls = answers[: len(keys)], answers[len(keys):]
        # tensorizer's to_redis always writes K:header:0; a tensor of its own may be
        # named like a generation (16 hex digits), a tensorstream chunk only then.
        tensorizer = key_bytes(path) + b":header:0" in keys
        sized, leftover = [], []
        for k, n, ttl in zip(keys, sizes, ttls, strict=True):
            if is_staged_chunk(path, k) and (ttl >= 0 or not tensorizer):
                # A chunk a writer staged (with its staging expiry) belongs to no
                # object until a manifest names it: an unpublished write, or one whose
                # abort left it to expire. A persistent one outlived its manifest
                # (evicted, or a delete or commit cut short): only the manifest knew
                # the object's size, and the chunks left, read as a stream, were a
                # shorter object whenever its last chunks were gone too.
                if ttl < 0:
                    leftover.append(k)
                continue
            sized.append((k, n))
        return tensorizer_layout(path, sized), leftover

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
        planned = batches(layout, offset, want)
        done = [False] * len(planned)
        sem = asyncio.Semaphore(_BATCHES_IN_FLIGHT)

        async def fetch(i: int) -> None:
            async with sem:
                await self._fetch(layout, planned[i], buffer)
            done[i] = True
            report_progress()

        try:
            await _all_or_nothing([fetch(i) for i in range(len(planned))])
        except TensorstreamError as exc:
            received = 0
            for ok, batch in zip(done, planned, strict=True):
                if not ok:
                    break
                received += sum(n for _, _, n, _ in batch)
            if exc.temporary and received:
                broken = IncompleteReadError(
                    f"Redis read broken after {received} bytes: {exc.message}", received=received)
                broken.served = layout_version(layout)
                raise broken from exc
            raise
        return want

    async def _fetch(self, layout: Layout, batch: list[tuple[bytes, int, int, int]],
                     buffer: memoryview) -> None:
        results = await self.pipeline(
            [("getrange", (key, start, start + n - 1)) for key, start, n, _ in batch]
        )
        for (key, _start, n, pos), data in zip(batch, results, strict=True):
            check_reply(layout, key, n, data)
            copy_into(buffer[pos : pos + n], data)

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
            return _loop.run_sync(_bounded(self.readinto(path, offset, buffer, pin=pin),
                                           deadline, path))
        _check_size(layout, pin)
        want = _checked_length(layout, offset, buffer)
        if want == 0:
            return 0
        if self._blocking is None:
            self._blocking = BlockingRedisReader(self._client_kwargs(blocking=True), self.db,
                                                 self._creds.describe(looked_in=True),
                                                 self._creds.secrets(), width=self._width,
                                                 drop_idle=self._drop_idle_blocking)
        return self._blocking.readinto(layout, offset, buffer)

    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        return self._list(prefix)

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        for layout in await list_objects(self, prefix):
            yield _info(layout)

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        return RedisWriter(self, path, chunk_size=self.chunk_size)

    async def delete(self, path: str) -> None:
        try:
            layout = await self.resolve(path)
        except NotFoundError:
            # The chunks a manifest that is gone left behind (never an object):
            # removed with the name they were written under, else nothing could.
            _, leftover = await self._scan_tensorizer(path)
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
        """Delete ``keys`` (pipelined one by one: they may live on different cluster
        slots), 1000 at a time: ``keys`` may be a generator, never held whole."""
        it = iter(keys)
        while batch := builtins.list(itertools.islice(it, 1000)):
            await self.pipeline([("delete", (k,)) for k in batch])


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
