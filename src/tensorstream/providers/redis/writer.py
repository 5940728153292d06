"""Atomic Redis writer: stage chunks of a new generation, publish the manifest, drop the old.

1. Chunks ``K:<gen>:<offset>`` are ``SET`` with a staging TTL as they fill
   (a few in flight), so memory stays bounded and a crashed writer leaves
   nothing behind for long.
2. On commit the chunks are made persistent, then one Lua script replaces
   the manifest hash at ``K`` (a single key: atomic on a cluster too) and
   returns the previous generation.
3. The previous generation's chunks are deleted. A reader pinned to it then
   gets :class:`~tensorstream.errors.ObjectChangedError`, never a mix.

Parts in any order (``cp``): :meth:`RedisWriter.write_part` stages a part's
chunks at once, concurrently with other parts. Each chunk is written and
read back in one transaction (``MULTI SET GET EXEC``) and compared with the
source's bytes still in hand, before anything is published: Redis has no
digest of its own that is cheap (``redis.sha1hex`` in a script hashes ~100
MB/s, blocking the server), and bytes damaged on the way in are only seen
by looking at what the server holds. The chunks' keys carry a random
generation nobody else knows, so nothing else writes them afterwards; the
commit makes every chunk persistent and checks its length (``STRLEN``) in
one pipeline, and publishes only if every one is there at the length
written (an evicted chunk is never published). The manifest records the
sha256 of the source's bytes, which a whole read checks.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ...errors import IntegrityError, ObjectChangedError
from ..base import Writer
from .layout import chunk_key, manifest_fields

if TYPE_CHECKING:
    from .provider import RedisProvider

__all__ = ["RedisWriter", "STAGING_TTL_MS"]

log = logging.getLogger("tensorstream.redis")

#: Unpublished chunks expire after this long if the writer dies.
STAGING_TTL_MS = 24 * 3600 * 1000
_WRITES_IN_FLIGHT = 4

# Replace the manifest at KEYS[1] with the hash ARGV (field, value, ...);
# return the previous generation, size and chunk size (or nil).
_PUBLISH = """
local old = false
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  old = redis.call('HMGET', KEYS[1], 'generation', 'size', 'chunk_size')
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV))
return old
"""


class RedisWriter(Writer):
    """Writer returned by :meth:`RedisProvider.open_writer`."""

    def __init__(self, provider: RedisProvider, path: str, *, chunk_size: int) -> None:
        self._p = provider
        self._path = path
        self._cs = chunk_size
        self._gen = secrets.token_hex(8)
        self._buf = bytearray()
        self._size = 0
        self._hash = hashlib.sha256()
        self._tasks: set[asyncio.Task[None]] = set()
        self._keys: list[bytes] = []
        self._state = "open"  # open | publishing | committed | aborted
        #: write_part: each staged chunk's length, and the part size in use.
        self._lengths: dict[bytes, int] = {}
        self._part_size: int | None = None
        self._slots: asyncio.Semaphore | None = None
        self._failure: BaseException | None = None

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
            await self._submit(chunk)

    async def _submit(self, chunk: bytes) -> None:
        while len(self._tasks) >= _WRITES_IN_FLIGHT:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                self._tasks.discard(t)
                t.result()
        key = chunk_key(self._path, self._gen, self._size).encode("utf-8", "surrogateescape")
        self._keys.append(key)
        self._size += len(chunk)
        p = self._p

        async def put() -> None:
            await p.client().set(key, chunk, px=STAGING_TTL_MS)

        self._tasks.add(asyncio.ensure_future(p._guard(put)))

    # -- parts in any order ------------------------------------------------------
    wants_sha256 = True

    def part_size_for(self, total: int, wanted: int) -> int | None:
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
        p = self._p
        if self._slots is None:
            self._slots = asyncio.Semaphore(_WRITES_IN_FLIGHT)
        try:
            for start in range(0, len(data), self._cs):
                if self._failure is not None:
                    raise self._failure
                chunk = data[start: start + self._cs]  # sent as it is (no copy)
                key = chunk_key(self._path, self._gen, base + start).encode(
                    "utf-8", "surrogateescape")
                self._keys.append(key)
                self._lengths[key] = len(chunk)

                async def put(key: bytes = key, chunk: memoryview = chunk) -> Any:
                    # Staged and read back in one round trip, while the source's
                    # bytes are still in hand: compared before anything is
                    # published (never a corrupt object visible, even briefly).
                    pipe = p.client().pipeline(transaction=True)
                    pipe.set(key, chunk, px=STAGING_TTL_MS)
                    pipe.get(key)
                    return (await pipe.execute())[1]

                # One server: a few chunks in flight keep it busy; more would only
                # hold more replies (each a copy of its chunk) in memory.
                async with self._slots:
                    stored = await p._guard(put)
                if stored != chunk:
                    raise self._failed(IntegrityError(
                        f"verification failed: Redis holds other bytes than were sent for "
                        f"bytes {base + start}-{base + start + len(chunk) - 1} of "
                        f"{self._path!r}; nothing was published"))
        except BaseException as exc:
            # Not aborted here: other parts may still have chunks in flight, which
            # would land after the clean-up. The caller aborts once they stopped.
            self._failed(exc)
            raise

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
        size = sum(self._lengths.values())
        expected = -(-size // self._cs) if size else 0
        if len(self._lengths) != expected:
            raise ObjectChangedError(f"{len(self._lengths)} of {expected} chunks of "
                                     f"{self._path!r} were staged; nothing was published")
        await self._publish(size, sha256, check_lengths=True)

    async def _drain(self) -> None:
        tasks, self._tasks = self._tasks, set()
        if tasks:
            results = await asyncio.gather(*tasks, return_exceptions=True)
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
            await self._submit(chunk)
        await self._drain()
        await self._publish(self._size, self._hash.hexdigest(), check_lengths=False)

    async def _publish(self, size: int, sha256: str, *, check_lengths: bool) -> None:
        ops: list[tuple[str, tuple[Any, ...]]] = [("persist", (k,)) for k in self._keys]
        if check_lengths:
            ops += [("strlen", (k,)) for k in self._keys]
        answers = await self._p.pipeline(ops)
        persisted, lengths = answers[: len(self._keys)], answers[len(self._keys):]
        if not all(persisted):
            raise ObjectChangedError(
                f"staged chunks of {self._path!r} vanished before commit (expired or deleted)"
            )
        if check_lengths and [int(n) for n in lengths] != [self._lengths[k] for k in self._keys]:
            raise IntegrityError(
                f"verification failed: a staged chunk of {self._path!r} does not have the "
                "length written; nothing was published")
        fields = manifest_fields(size=size, chunk_size=self._cs, generation=self._gen,
                                 checksum=f"sha256:{sha256}", mtime=time.time())
        args = [x for kv in fields.items() for x in kv]
        key = self._path.encode("utf-8", "surrogateescape")
        self._state = "publishing"

        async def publish() -> Any:
            return await self._p.client().eval(_PUBLISH, 1, key, *args)

        old = await self._p._guard(publish)
        self._state = "committed"
        self._p._layouts.pop(self._path, None)
        await self._drop_old(old)

    async def _drop_old(self, old: Any) -> None:
        if not old or old[0] is None or old[0].decode() == self._gen:
            return
        try:
            gen, size, cs = old[0].decode(), int(old[1]), int(old[2])
            keys = [chunk_key(self._path, gen, s).encode("utf-8", "surrogateescape")
                    for s in range(0, size, cs)]
            await asyncio.shield(self._p.delete_keys(keys))
        except Exception as exc:  # the new object is published; old chunks are garbage
            log.warning("could not delete the previous generation of %r: %s", self._path, exc)

    async def abort(self) -> None:
        if self._state in ("committed", "aborted"):
            return
        publishing = self._state == "publishing"
        self._state = "aborted"
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = set()
        self._buf = bytearray()
        try:
            if publishing and await self._published():
                self._state = "committed"  # the publish went through before we were stopped
                return
            await self._p.delete_keys(self._keys)
        except Exception as exc:  # chunks still expire after STAGING_TTL_MS
            log.warning("could not remove staged chunks of %r: %s", self._path, exc)

    async def _published(self) -> bool:
        key = self._path.encode("utf-8", "surrogateescape")
        got = await self._p.pipeline([("hget", (key, "generation"))], raise_on_error=False)
        return isinstance(got[0], bytes) and got[0].decode() == self._gen
