"""A Redis writer's commit: the staged chunks made persistent, the manifest
published, the previous generation dropped -- and a publish undone by an abort.

On commit the chunks are made persistent (and, for parts, their lengths
checked with ``STRLEN``) in pipelines of :data:`COMMIT_BATCH` chunks, then one
Lua script replaces the manifest hash at ``K`` (a single key: atomic on a
cluster too) and returns the previous generation. A publish whose answer is
lost may have run: the manifest is looked at, and if it holds this
generation the write succeeded (the previous one is known from a look taken
with the ``PERSIST``); if not, it is sent again (:meth:`Publishing._resent`: the
retry policy, as for every step of a write). Every attempt goes only over that
manifest (:data:`_PUBLISH_OVER`): another writer's published since is left, as if
this write had come first. The previous generation's chunks are then deleted. A
publish that raced an abort is removed again (:meth:`Publishing._unpublish`),
only while the manifest is still this writer's generation
(:data:`DELETE_IF_GENERATION`).

:class:`Publishing` is the base of :class:`~.writer.RedisWriter`, which stages
the chunks and decides when to commit or abort.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import IntegrityError, ObjectChangedError, TensorstreamError
from ..base import Writer
from .layout import chunk_key, manifest_fields, replaced_chunk_keys

if TYPE_CHECKING:
    from .provider import RedisProvider

__all__ = ["COMMIT_BATCH", "DELETE_IF_GENERATION", "LOOKS", "Publishing", "settled"]

log = logging.getLogger("tensorstream.redis")

T = TypeVar("T")

#: Chunks made persistent (and their lengths checked) per pipeline at commit: one
#: pipeline of every chunk held all their commands and replies at once.
COMMIT_BATCH = 8192

#: Replace the manifest at ``KEYS[1]`` with the hash ``ARGV[2:]`` (field, value, ...)
#: only while its generation is ``ARGV[1]`` ("": none), and return the previous
#: generation, size, chunk size and format (or nil); else ``{generation}``, the one there.
_PUBLISH_OVER = """
local now = ''
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  now = redis.call('HGET', KEYS[1], 'generation') or ''
end
if now ~= ARGV[1] then
  return {now}
end
local old = false
if now ~= '' or redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  old = redis.call('HMGET', KEYS[1], 'generation', 'size', 'chunk_size', 'tensorstream')
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return old
"""

#: The manifest's generation, size, chunk size and format at ``KEYS[1]`` (nil: no hash).
_MANIFEST = """
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  return redis.call('HMGET', KEYS[1], 'generation', 'size', 'chunk_size', 'tensorstream')
end
return false
"""

#: Looks taken at whether a publish whose answer was lost was applied (a temporary
#: error each: the drop that lost the answer may have broken other pooled connections).
LOOKS = 3

#: Delete ``KEYS[1]`` only while it is still the manifest of generation ``ARGV[1]``.
DELETE_IF_GENERATION = """
if redis.call('TYPE', KEYS[1])['ok'] == 'hash'
   and redis.call('HGET', KEYS[1], 'generation') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Publishing(Writer):
    """The commit side of :class:`~.writer.RedisWriter`: where its staged chunks
    are, their publish, and its undoing. The writer sets these attributes."""

    _p: RedisProvider
    _path: str
    _cs: int
    _gen: str
    #: The date the manifest gets (a copy's source's), else the time of the publish.
    _mtime: float | None
    #: write(): the bytes staged; write_part(): the object's size and a byte per
    #: chunk (1: staged), None until part_size_for().
    _size: int
    _total: int
    _staged: bytearray | None
    _state: str  # open | publishing | committed | aborted
    #: Every Redis interaction sent and not yet answered.
    _inflight: set[asyncio.Future[Any]]
    #: The commit's persist-and-publish, once started (abort undoes it).
    _publish_job: asyncio.Future[Any] | None
    #: The manifest the publish replaces, as read just before it: what is
    #: dropped when the publish's own answer (which names it) was lost.
    _replacing: Any

    def _key(self, offset: int) -> bytes:
        return chunk_key(self._path, self._gen, offset).encode("utf-8", "surrogateescape")

    def _chunk_length(self, offset: int) -> int:
        """The length of the chunk at ``offset`` of an object of ``_total`` bytes."""
        return min(self._cs, self._total - offset)

    def _staged_offsets(self) -> Iterator[int]:
        """Where every chunk sent (or about to be) starts: those of :meth:`write` in
        order, or those :meth:`write_part` staged."""
        if self._staged is None:
            return iter(range(0, self._size, self._cs))
        return (i * self._cs for i in itertools.compress(range(len(self._staged)),
                                                         self._staged))

    def _staged_count(self) -> int:
        if self._staged is None:
            return -(-self._size // self._cs)
        return len(self._staged) - self._staged.count(0)

    async def _publish(self, size: int, sha256: str, *, check_lengths: bool) -> None:
        fields = manifest_fields(size=size, chunk_size=self._cs, generation=self._gen,
                                 checksum=f"sha256:{sha256}",
                                 mtime=time.time() if self._mtime is None else self._mtime)
        args = [x for kv in fields.items() for x in kv]
        if self._state != "open":  # aborted while the commit waited for its chunks
            raise ValueError(f"the Redis writer of {self._path!r} was aborted during its "
                             "commit; nothing is published")
        self._state = "publishing"
        job = self._publish_job = asyncio.ensure_future(
            self._persist_and_publish(args, check_lengths=check_lengths))
        self._inflight.add(job)
        job.add_done_callback(settled(self._inflight))
        old = await asyncio.shield(job)  # stopped here, it still ends; abort waits for it
        if self._state != "publishing":  # aborted meanwhile: the abort removes it again
            raise ValueError(f"the Redis writer of {self._path!r} was aborted during its "
                             "commit; nothing is published")
        self._state = "committed"
        self._p._layouts.pop(self._path, None)
        await self._drop_old(old)

    async def _persist_and_publish(self, args: list[str], *, check_lengths: bool) -> Any:
        """Make every chunk persistent (and check its length), then publish the
        manifest; returns the previous generation. Not started, and not
        published, once an abort began."""
        key = self._path.encode("utf-8", "surrogateescape")
        count, offsets = self._staged_count(), self._staged_offsets()
        for first in range(0, count, COMMIT_BATCH) or [0]:
            starts = list(itertools.islice(offsets, COMMIT_BATCH))
            keys = [self._key(o) for o in starts]
            ops: list[tuple[str, tuple[Any, ...]]] = [("persist", (k,)) for k in keys]
            if check_lengths:
                ops += [("strlen", (k,)) for k in keys]
            last = first + COMMIT_BATCH >= count
            if last:  # the manifest this publish replaces (see _replacing), in the same trip
                ops.append(("eval", (_MANIFEST, 1, key)))
            answers = await self._resent(functools.partial(self._p.pipeline, ops))
            if last:
                self._replacing, answers = answers[-1], answers[:-1]
            persisted, lengths = answers[: len(keys)], answers[len(keys):]
            if not all(persisted) and not await self._persistent(
                    [k for k, done in zip(keys, persisted, strict=True) if not done]):
                raise ObjectChangedError(
                    f"staged chunks of {self._path!r} vanished before commit: evicted (Redis is "
                    "at maxmemory, and chunks being written carry an expiry, which volatile-* "
                    "policies evict first), expired or deleted; nothing was published"
                )
            if check_lengths and [_length(n) for n in lengths] != [self._chunk_length(o)
                                                                   for o in starts]:
                raise IntegrityError(
                    f"verification failed: a staged chunk of {self._path!r} does not have the "
                    "length written; nothing was published")
        if self._state != "publishing":  # aborted while the chunks were made persistent
            raise ValueError(f"the Redis writer of {self._path!r} was aborted during its "
                             "commit; nothing is published")

        expected = (self._replacing[0] if self._replacing and self._replacing[0] is not None
                    else b"")

        async def publish() -> Any:
            # Only over the manifest the PERSIST saw, the first time too. Sent again:
            # another writer's, published meanwhile, may have deleted this generation's
            # chunks (ours was the one it replaced) and must not be replaced by a
            # manifest of them. The first time: one published since the look would be
            # replaced unseen if the answer were lost (the look then finds ours, and
            # only the generation the PERSIST saw is dropped: its chunks stayed for
            # ever); this write then happened first, and was replaced.
            return await self._p.client().eval(_PUBLISH_OVER, 1, key, expected, *args)

        async def attempt() -> Any:
            try:
                old = await self._p._guard(publish)
            except TensorstreamError as exc:
                # Redis runs a command it received: a reply lost on the way back (a
                # dropped connection, a timeout) may follow a publish that happened.
                # Reported as a failure, the abort then removed the new manifest:
                # neither version left, both generations' chunks kept for ever. Sent
                # again only once the manifest is seen not to be ours.
                if not exc.temporary or not await self._published_anyway(key):
                    raise
                log.info("the publish of %r lost its answer (%s) but was applied",
                         self._path, type(exc).__name__)
                return self._replacing
            if isinstance(old, list) and len(old) == 1:  # refused: see _PUBLISH_OVER
                if old[0] != self._gen.encode():
                    await self._replaced_meanwhile(old[0])
                # ours (an attempt whose looks failed was applied) or another writer's over
                # it: the generation the PERSIST saw was replaced, its chunks must go
                return self._replacing
            return old

        return await self._resent(attempt)

    async def _replaced_meanwhile(self, other: bytes) -> None:
        """Another writer published ``other`` between an attempt of this publish and
        the next: this write happened first (its manifest replaced) or never; either
        way this generation's chunks are no one's now, and go."""
        log.info("the publish of %r lost its answer and another writer's (generation "
                 "%s) followed; it stays", self._path, other.decode(errors="replace"))
        try:
            await self._resent(lambda: self._p.delete_keys(
                self._key(o) for o in self._staged_offsets()))
        except TensorstreamError as exc:
            log.warning("could not remove the chunks of %r's replaced write: %s",
                        self._path, exc)

    async def _resent(self, send: Callable[[], Awaitable[T]]) -> T:
        """``await send()``, sent again on a temporary error under the retry policy
        (:func:`~tensorstream.layers.resend.sent_again`, the loop every writer's
        requests run in) while this writer is not aborted (an abort waits for what is
        in flight, then cleans up: nothing may be sent after it)."""
        try:
            return await send()  # (nearly always at once: tenacity is imported only if not)
        except TensorstreamError as exc:
            if not (exc.temporary and self._state != "aborted"):
                raise
            first = exc
        from ...layers.resend import sent_again

        return await sent_again(self._p._config.retry, first, send,
                                still_open=lambda: self._state != "aborted",
                                what=f"a write of {self._path!r}")

    async def _persistent(self, keys: list[bytes]) -> bool:
        """Whether every chunk at ``keys``, whose ``PERSIST`` answered 0, is there without
        an expiry (``TTL`` -1): a ``PERSIST`` sent again after a lost answer answers 0
        for a chunk the first one made persistent; one gone (-2) vanished."""
        ttls = await self._resent(lambda: self._p.pipeline([("ttl", (k,)) for k in keys]))
        return all(t == -1 for t in ttls)

    async def _published_anyway(self, key: bytes) -> bool:
        """Whether the manifest at ``key`` is this writer's generation (looked at
        a few times: the connection that lost the answer may not be the only
        one that broke)."""
        async def look() -> Any:
            return await self._p.client().eval(_MANIFEST, 1, key)

        for _ in range(LOOKS):
            try:
                now = await self._p._guard(look)
            except TensorstreamError as exc:
                if exc.temporary:
                    continue
                return False
            return bool(now) and now[0] is not None and now[0].decode() == self._gen
        return False

    async def _drop_old(self, old: Any) -> None:
        if not old or old[0] is None or old[0].decode() == self._gen:
            return
        for look in range(1, LOOKS + 1):
            try:
                keys = replaced_chunk_keys(self._path, old)  # (generated: never all at once)
                await asyncio.shield(self._p.delete_keys(keys))
                return
            except Exception as exc:  # the new object is published; old chunks are garbage
                # ... that never expire (persistent): sent again on a temporary error
                # (a dropped connection), idempotent.
                if look < LOOKS and isinstance(exc, TensorstreamError) and exc.temporary:
                    continue
                log.warning("could not delete the previous generation of %r: %s",
                            self._path, exc)
                return
    async def _unpublish(self) -> None:
        """Remove the manifest a commit racing this abort published, if it did
        (only if it is still this writer's generation), and the generation it
        replaced, which nothing refers to any more."""
        job = self._publish_job
        if job is None:
            return
        key = self._path.encode("utf-8", "surrogateescape")

        async def drop() -> Any:
            return await self._p.client().eval(DELETE_IF_GENERATION, 1, key, self._gen)

        self._p._layouts.pop(self._path, None)
        if await self._p._guard(drop):
            answered = not job.cancelled() and job.exception() is None
            await self._drop_old(job.result() if answered else self._replacing)

def settled(inflight: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    """A done callback: forget a finished interaction, its failure retrieved
    (whoever awaited it saw it; one nobody awaits any more must not warn)."""
    def done(task: asyncio.Future[Any]) -> None:
        inflight.discard(task)
        if not task.cancelled():
            task.exception()
    return done


def _length(reply: Any) -> int | None:
    """A ``STRLEN`` reply as a length; None for one that is no integer (a lying
    server's ``b"abc"``): the length check then fails, as for a wrong length."""
    if isinstance(reply, int):
        return reply
    try:
        return int(reply)
    except (TypeError, ValueError):
        return None

