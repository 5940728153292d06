"""Atomic Redis writer: stage chunks of a new generation, publish the manifest, drop the old.

1. Chunks ``K:<gen>:<offset>`` are ``SET`` with a staging TTL as they fill
   (a few pipelines in flight; chunks that fill while all are busy go
   together in the next, up to :data:`BATCH_BYTES`), so memory stays bounded,
   small chunks cost a round trip per batch rather than per chunk, and a
   crashed writer leaves nothing behind for long.
2. On commit (:mod:`.publish`) the chunks are made persistent, then one Lua script replaces
   the manifest hash at ``K`` (a single key: atomic on a cluster too) and
   returns the previous generation. A publish whose answer is lost may have
   run: the manifest is looked at, and if it holds this generation the write
   succeeded (the previous one is known from a look taken with the ``PERSIST``).
3. The previous generation's chunks are deleted. A reader pinned to it then
   gets :class:`~tensorstream.errors.ObjectChangedError`, never a mix.

Parts in any order (``cp``): :meth:`RedisWriter.write_part` stages a part's
chunks at once, concurrently with other parts. Its chunks are written and
read back in batches of up to :data:`BATCH_BYTES`, each one round trip (a
``MULTI`` of ``SET``/``GET`` pairs; on a cluster, whose keys of one batch
live on several nodes, a pipeline: each node's connection runs them in
order), and compared with the
source's bytes still in hand, before anything is published: Redis has no
digest of its own that is cheap (``redis.sha1hex`` in a script hashes ~100
MB/s, blocking the server), and bytes damaged on the way in are only seen
by looking at what the server holds. The chunks' keys carry a random
generation nobody else knows, so nothing else writes them afterwards; the
commit makes every chunk persistent and checks its length (``STRLEN``) in
pipelines of :data:`COMMIT_BATCH` chunks, and publishes only if every one
is there at the length
written (an evicted chunk is never published). The manifest records the
sha256 of the source's bytes, which a whole read checks.

Abort is final. A Redis command is not stopped by the client that stops
waiting for it: once sent, the server runs it. So nothing this writer sent
is cancelled; every command in flight (chunks, the commit) is a task that
:meth:`RedisWriter.abort` waits for before it deletes anything, and no new
one starts once the abort began. A chunk never lands after the clean-up
(where it would stay for ``STAGING_TTL_MS``), and a publish that raced the
abort either never happened or finished first and is removed again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from redis import exceptions as rex

from ...errors import (
    ConfigurationError,
    IntegrityError,
    ObjectChangedError,
    PermissionDeniedError,
    TensorstreamError,
    UnsupportedOperationError,
)
from . import layout
from .publish import COMMIT_BATCH, DELETE_IF_GENERATION, LOOKS, Publishing, settled
from .width import refused

if TYPE_CHECKING:
    from .provider import RedisProvider

__all__ = ["BATCH_BYTES", "COMMIT_BATCH", "DELETE_IF_GENERATION", "STAGING_TTL_MS",
           "RedisWriter"]

log = logging.getLogger("tensorstream.redis")

#: Unpublished chunks expire after this long if the writer dies.
STAGING_TTL_MS = 24 * 3600 * 1000
_WRITES_IN_FLIGHT = 4
#: Chunks staged in one round trip: up to this many bytes (at least one chunk). With
#: 1 KiB chunks, one SET (and its round trip) per chunk made a write of N chunks
#: N round trips; the default 4 MiB chunks still go one per pipeline.
BATCH_BYTES = 4 << 20


class RedisWriter(Publishing):
    """Writer returned by :meth:`RedisProvider.open_writer`."""

    def __init__(self, provider: RedisProvider, path: str, *, chunk_size: int,
                 mtime: float | None = None) -> None:
        self._p = provider
        self._path = path
        self._cs = chunk_size
        self._mtime = mtime
        self._gen = secrets.token_hex(8)
        self._buf = bytearray()
        self._size = 0
        self._hash = hashlib.sha256()
        self._tasks: set[asyncio.Future[Any]] = set()
        #: write(): chunks filled while every pipeline was busy (sent together)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._state = "open"  # open | publishing | committed | aborted
        #: write_part: the object's size, a byte per chunk (1: staged), the part size in
        #: use. No key is kept: each is named by its offset (a list of every key, and a
        #: dict of their lengths, held ~180 bytes a chunk: 3 GB at 2**24 chunks).
        self._total = 0
        self._staged: bytearray | None = None
        self._part_size: int | None = None
        self._slots: asyncio.Semaphore | None = None
        self._failure: BaseException | None = None
        #: Every Redis interaction sent and not yet answered (see _send).
        self._inflight: set[asyncio.Future[Any]] = set()
        #: Whether one was answered: until then the server may have taken no command.
        self._answered = False
        #: The commit's persist-and-publish, once started (abort undoes it).
        self._publish_job: asyncio.Future[Any] | None = None
        #: The manifest the publish replaces, as read just before it: what is
        #: dropped when the publish's own answer (which names it) was lost.
        self._replacing: Any = None

    def __repr__(self) -> str:
        return f"<RedisWriter {self._path!r} generation={self._gen} {self._state}>"

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._state != "open":
            raise ValueError(f"write to a {self._state} Redis writer")
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._buf += view
        while len(self._buf) >= self._cs:
            chunk = bytes(self._buf[: self._cs])
            del self._buf[: self._cs]
            await self._stage(chunk)
        if self._pending and self._running() < _WRITES_IN_FLIGHT:
            self._send_pending()  # else the next pipeline to end sends them (_sent)

    def _send(self, fn: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any]:
        """Start one Redis interaction as a task that runs to its answer, whoever
        stops waiting for it: the server runs what it was sent regardless, so
        :meth:`abort` must wait for it rather than cancel it."""
        if self._state == "aborted":
            raise ValueError("write to an aborted Redis writer")
        # Sent again on a temporary error (a dropped connection): a chunk goes to a key
        # of this write's own generation, which nothing else writes, so a second SET of
        # the same bytes is harmless (one dropped connection failed the whole write).
        task = asyncio.ensure_future(self._resent(lambda: self._p._guard(fn)))
        self._inflight.add(task)
        task.add_done_callback(settled(self._inflight))
        task.add_done_callback(self._note_answer)
        return task

    def _note_answer(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._answered = True

    async def _stage(self, chunk: bytes) -> None:
        """Queue ``chunk``; send the queue at once while a pipeline is free, else
        once it holds :data:`BATCH_BYTES` (then waiting for a free one)."""
        self._check_fits(self._size + len(chunk))
        key = self._key(self._size)
        self._size += len(chunk)
        self._pending.append((key, chunk))
        self._pending_bytes += len(chunk)
        self._settle_done()
        if len(self._tasks) < _WRITES_IN_FLIGHT or self._pending_bytes >= BATCH_BYTES:
            await self._flush()

    def _settle_done(self) -> None:
        """Forget finished pipelines (a failed one raises its error here)."""
        for t in [t for t in self._tasks if t.done()]:
            self._tasks.discard(t)
            t.result()

    def _running(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    async def _flush(self) -> None:
        """Send the queued chunks as one pipeline, once one of the few is free."""
        while len(self._tasks) >= _WRITES_IN_FLIGHT:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                self._tasks.discard(t)
                t.result()
        if self._state != "open":  # aborted while this write waited for a slot
            raise ValueError(f"write to a {self._state} Redis writer")
        self._send_pending()

    def _sent(self, _task: asyncio.Future[Any]) -> None:
        """A pipeline ended: chunks queued meanwhile go now (a writer fed a chunk per
        :meth:`write` sent each alone, a round trip each)."""
        if self._state == "open" and self._pending and self._running() < _WRITES_IN_FLIGHT:
            self._send_pending()

    def _send_pending(self) -> None:
        batch, self._pending, self._pending_bytes = self._pending, [], 0
        if not batch:
            return
        p = self._p

        async def put() -> None:
            pipe = p.client().pipeline(transaction=False)
            for key, chunk in batch:
                pipe.set(key, chunk, px=STAGING_TTL_MS)
            await pipe.execute()

        task = self._send(lambda: self._within_bulk_limit(max(len(c) for _, c in batch), put))
        self._tasks.add(task)
        task.add_done_callback(self._sent)

    # -- parts in any order ------------------------------------------------------
    wants_sha256 = True

    def part_size_for(self, total: int, wanted: int) -> int | None:
        self._check_fits(total)
        self._total = total
        self._staged = bytearray(-(-total // self._cs))
        self._part_size = self._cs * max(1, wanted // self._cs)  # whole chunks
        return self._part_size

    async def write_part(self, index: int, data: memoryview, *, md5: bytes) -> None:
        if self._failure is not None:
            raise self._failure  # parts run concurrently: the one that failed first says why
        if self._state != "open":
            raise ValueError(f"write to a {self._state} Redis writer")
        if self._part_size is None:
            raise ValueError("part_size_for() first: it sets where each part starts")
        base = index * self._part_size
        staged = self._staged
        assert staged is not None  # (set with _part_size)
        if index < 0 or base + len(data) > self._total or (
                len(data) != min(self._part_size, self._total - base)):
            raise ValueError(f"part {index} of {len(data)} bytes is not one part_size_for() "
                             f"planned ({self._part_size}-byte parts of {self._total} bytes)")
        p = self._p
        if self._slots is None:
            self._slots = asyncio.Semaphore(_WRITES_IN_FLIGHT)
        step = self._cs * max(1, BATCH_BYTES // self._cs)  # whole chunks per round trip
        try:
            for first in range(0, len(data), step):
                if self._failure is not None:
                    raise self._failure
                batch: list[tuple[bytes, memoryview, int]] = []
                for start in range(first, min(first + step, len(data)), self._cs):
                    chunk = data[start: start + self._cs]  # sent as it is (no copy)
                    staged[(base + start) // self._cs] = 1
                    batch.append((self._key(base + start), chunk, base + start))

                async def put(batch: list[tuple[bytes, memoryview, int]] = batch) -> Any:
                    # Staged and read back in one round trip, while the source's
                    # bytes are still in hand: compared before anything is
                    # published (never a corrupt object visible, even briefly).
                    # A cluster's batch spans slots (no MULTI): its pipeline sends
                    # each node its pairs on one connection, run in order.
                    pipe = p.client().pipeline(transaction=not p.cluster)
                    for key, chunk, _ in batch:
                        pipe.set(key, chunk, px=STAGING_TTL_MS)
                        pipe.get(key)
                    replies = await self._within_bulk_limit(
                        max(len(c) for _, c, _ in batch), pipe.execute)
                    return replies[1::2]

                # One server: a few batches in flight keep it busy; more would only
                # hold more replies (each a copy of its chunks) in memory. Shielded:
                # a part stopped here leaves its batch to finish (abort waits for it).
                async with self._slots:
                    if self._state != "open":
                        raise ValueError(f"write to a {self._state} Redis writer")
                    stored = await asyncio.shield(self._send(put))
                for (_key, chunk, at), got in zip(batch, stored, strict=True):
                    if got != chunk:
                        raise self._failed(IntegrityError(
                            f"verification failed: Redis holds other bytes than were sent "
                            f"for bytes {at}-{at + len(chunk) - 1} of "
                            f"{self._path!r}; nothing was published"))
        except BaseException as exc:
            # Not aborted here: other parts may still have chunks in flight, which
            # would land after the clean-up. The caller aborts once they stopped.
            self._failed(exc)
            raise

    def _check_fits(self, size: int) -> None:
        """Refuse, before more is staged, an object that readers would refuse:
        more than :data:`.layout.MAX_CHUNKS` chunks or :data:`.layout.MAX_OBJECT_SIZE`
        bytes (was: staged and published, then every read failed)."""
        if size > layout.MAX_OBJECT_SIZE:
            raise UnsupportedOperationError(
                f"{size} bytes is more than tensorstream stores in one Redis object "
                f"({layout.MAX_OBJECT_SIZE} bytes); split it into several objects (shards)",
                service="redis", path=self._path)
        if -(-size // self._cs) > layout.MAX_CHUNKS:
            need = -(-size // layout.MAX_CHUNKS)
            raise ConfigurationError(
                f"{size} bytes in chunks of {self._cs} is more than {layout.MAX_CHUNKS} "
                f"chunks, the most a Redis object may have: pass a redis_chunk_size of at "
                f"least {need} (the object's size / {layout.MAX_CHUNKS})",
                service="redis", path=self._path)

    async def _within_bulk_limit(self, size: int, send: Callable[[], Awaitable[Any]]) -> Any:
        """``await send()`` (a chunk's ``SET``). A value longer than the server's
        ``proto-max-bulk-len`` makes it drop the connection: that alone read
        "Connection reset by peer", retried in vain; the limit is named instead."""
        try:
            return await send()
        except (rex.ConnectionError, OSError) as exc:
            if refused(exc):  # (maxclients: the chunk never reached the server)
                raise
            limit = await self._p.bulk_limit()
            if limit is None or size <= limit:
                raise
            raise ConfigurationError(
                f"Redis takes values of at most {limit} bytes (its proto-max-bulk-len) and "
                f"a chunk of {self._path!r} has {size}: pass redis_chunk_size={limit} or "
                "less, or raise proto-max-bulk-len") from exc

    def _failed(self, exc: BaseException) -> BaseException:
        if self._failure is None and not isinstance(exc, asyncio.CancelledError):
            self._failure = exc
        return exc

    async def commit_parts(self, count: int, *, sha256: str | None = None) -> None:
        if self._state == "committed":
            return
        if self._state != "open":
            raise ValueError(f"commit of a {self._state} Redis writer")
        if sha256 is None:
            raise ValueError("a Redis object's manifest needs the sha256 of its bytes")
        if self._staged is None:
            raise ValueError("part_size_for() first: it sets where each part starts")
        if self._staged_count() != len(self._staged):
            raise ObjectChangedError(f"{self._staged_count()} of {len(self._staged)} chunks "
                                     f"of {self._path!r} were staged; nothing was published")
        await self._publish(self._total, sha256, check_lengths=True)

    async def _drain(self) -> None:
        tasks, self._tasks = self._tasks, set()
        if tasks:
            # Shielded: a commit stopped here must not cancel the chunks (see _send).
            results = await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
            for r in results:
                if isinstance(r, BaseException):
                    raise r

    async def commit(self) -> None:
        if self._state == "committed":
            return
        if self._state != "open":
            raise ValueError(f"commit of a {self._state} Redis writer")
        if self._buf:
            chunk, self._buf = bytes(self._buf), bytearray()
            await self._stage(chunk)
        await self._flush()
        await self._drain()
        await self._publish(self._size, self._hash.hexdigest(), check_lengths=False)

    async def abort(self) -> None:
        if self._state in ("committed", "aborted"):
            return
        self._state = "aborted"  # from here on nothing new is sent (see _send)
        self._buf = bytearray()
        self._pending, self._pending_bytes = [], 0
        # Waited for, never cancelled: each was sent, so the server runs it; the
        # clean-up must come after, or a chunk lands once it is done.
        await asyncio.gather(*self._inflight, return_exceptions=True)
        self._tasks = set()
        for look in range(1, LOOKS + 1):
            try:
                await self._unpublish()
                await self._p.delete_keys(self._key(o) for o in self._staged_offsets())
                return
            except Exception as exc:
                # Staged chunks expire after STAGING_TTL_MS, but a commit that failed
                # after making them persistent left them for ever: sent again on a
                # temporary error (a dropped connection); both steps are idempotent.
                if look < LOOKS and isinstance(exc, TensorstreamError) and exc.temporary:
                    continue
                if not self._answered and isinstance(exc, PermissionDeniedError):
                    # No command of the write was answered and the server refuses this
                    # client (no or a wrong password): it staged nothing to remove, and
                    # the write's own error says why (was: the same error twice).
                    log.debug("nothing staged for %r to remove: %s", self._path, exc)
                    return
                log.warning("could not remove staged chunks of %r: %s", self._path, exc)
                return
