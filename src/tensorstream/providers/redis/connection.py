"""The Redis provider's connection: its clients and every interaction's guard.

:class:`RedisConnection` (the base of
:class:`~tensorstream.providers.redis.provider.RedisProvider`) holds one
redis.asyncio client per event loop (a cluster client with ``cluster``) and the
blocking reader's; runs each interaction through :meth:`RedisConnection._guard`,
the one place its errors are mapped (:mod:`.errors`) and the width the server
allows is kept (:mod:`.width`); and finds a port that speaks TLS to a
``redis://`` client, or plain text to a ``rediss://`` one.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry as BlockingRetry

from ... import _loop
from ..._client_cert import ca_context, ca_directory_data, load_client_cert
from ...config import CommonConfig, split_options
from ...errors import ConnectionFailedError, ProtocolError, TensorstreamError
from .arrivals import idle_timed
from .blocking import BlockingRedisReader
from .config import RedisCredentials
from .errors import (
    REDIS_ERRORS,
    closed_by_server,
    map_redis_error,
    plain_text_instead_of_tls,
    tls_instead_of_plain_text,
)
from .width import RETRY_IDLE, Width

__all__ = ["BATCHES_IN_FLIGHT", "RedisConnection"]

log = logging.getLogger("tensorstream.redis")
T = TypeVar("T")

#: A readinto's pipelines (``batches``) run a few at a time, so one huge read
#: does not serialise on one socket.
BATCHES_IN_FLIGHT = 4
#: How long ``close`` waits for a client of another (running) loop to close.
_CLOSE_ELSEWHERE_S = 5.0


class RedisConnection:
    """The clients of one Redis database or cluster, and the guard every
    interaction runs through. The arguments are
    :class:`~tensorstream.providers.redis.provider.RedisProvider`'s (checked there)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool,
        db: int,
        cluster: bool,
        credentials: RedisCredentials | None,
        config: CommonConfig | None,
        ca_bundle: str | None,
        insecure: bool,
        client_cert: str | None,
        client_key: str | None,
    ) -> None:
        self.host, self.port, self.tls, self.db, self.cluster = host, port, tls, db, cluster
        self._tls_answered = False  # set once a TLS call got an answer
        self._answered = False  # set once a plain-text call got one
        self._creds = credentials or RedisCredentials()
        self._config = config or split_options({})[0]
        if tls:  # redis-py loads the files on each connect: a CA bundle that is no PEM
            # or a bad pair was retried as a connection failure, an encrypted key prompted
            ctx = ca_context(ca_bundle)
            if client_cert is not None:
                load_client_cert(ctx, client_cert, client_key)
        #: A CA directory's certificates for a cluster, whose (asyncio) client takes
        #: CA data but no directory (no ssl_ca_path)
        self._ca_data: str | None = None
        if tls and cluster and ca_bundle is not None and os.path.isdir(ca_bundle):
            self._ca_data = ca_directory_data(ca_bundle)
        self._tls_files = (ca_bundle, client_cert, client_key)
        self._insecure = bool(insecure)
        #: One client per event loop: reads hop between the caller's loop and the I/O
        #: loop (``readinto_blocking``), and a client (its connections, a cluster's
        #: slot map) belongs to the loop it was made on.
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._clients_pid = os.getpid()  # (a forked child's copies belong to no loop of its own)
        self._blocking: BlockingRedisReader | None = None
        self._blocking_lock = threading.Lock()
        #: reads the read-ahead's workers wait for on the I/O loop (:meth:`close` stops them)
        self._reading: set[asyncio.Task[Any]] = set()
        self._reads_stopped = False  # close() cancelled some of them
        #: how many interactions run at once (both clients): narrowed by a server
        #: refusing connections for its maxclients
        self._width = Width()

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
            # Every concurrent read may pipeline BATCHES_IN_FLIGHT batches at once;
            # the pool must never run dry ("Too many connections" is not retried).
            "max_connections": self._config.transfer.concurrency * BATCHES_IN_FLIGHT + 8,
        }
        if self.tls:
            ca, cert, key = self._tls_files
            if self._ca_data is not None:
                kw["ssl_ca_data"] = self._ca_data
            elif ca is not None and os.path.isdir(ca):  # (hashed by 'openssl rehash')
                kw["ssl_ca_path"] = ca
            else:
                kw["ssl_ca_certs"] = ca
            kw.update(
                ssl=True,
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
            if self.cluster:
                client = RedisCluster(**kw)
            else:
                client = aredis.Redis(db=self.db, **kw)
                pool = client.connection_pool  # (plain or TLS: the class redis-py chose)
                pool.connection_class = idle_timed(pool.connection_class)
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

    def _blocking_reader(self) -> BlockingRedisReader:
        """The blocking path's reader (one per provider, made on first use). The
        read-ahead's first reads ask at once: each made one, the last was kept, and
        :meth:`close` left the others' reads running and their connections open."""
        with self._blocking_lock:
            if self._blocking is None:
                self._blocking = BlockingRedisReader(
                    self._client_kwargs(blocking=True), self.db,
                    self._creds.describe(looked_in=True), self._creds.secrets(),
                    width=self._width, drop_idle=self._drop_idle_blocking)
            return self._blocking

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
        here = asyncio.get_running_loop()
        await self._stop_reads(here)
        with self._blocking_lock:
            blocking, self._blocking = self._blocking, None
        if blocking is not None:
            blocking.close()
        clients, self._clients = self._clients, {}
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

    async def _stop_reads(self, here: asyncio.AbstractEventLoop) -> None:
        """Cancel the reads in :attr:`_reading` and wait for those on this loop to end,
        before the clients close: they went on until the server answered (a paused
        server held the read-ahead's workers, and the exit waiting for them), and a
        read whose connection was closed mid handshake waited out the idle timeout
        for an answer to a command redis-py had not sent."""
        if self._clients_pid != os.getpid():
            return  # (the parent's, on a loop that does not run here)
        reading = [t for t in self._reading if t is not asyncio.current_task() and not t.done()]
        self._reads_stopped = self._reads_stopped or bool(reading)
        for task in reading:
            if task.get_loop() is here:
                task.cancel()
            elif task.get_loop().is_running():
                task.get_loop().call_soon_threadsafe(task.cancel)
        mine = [t for t in reading if t.get_loop() is here]
        if mine:
            await asyncio.wait(mine, timeout=_CLOSE_ELSEWHERE_S)

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
