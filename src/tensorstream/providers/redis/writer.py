"""Atomic Redis writer: stage chunks of a new generation, publish the manifest, drop the old.

1. Chunks ``K:<gen>:<offset>`` are ``SET`` with a staging TTL as they fill
   (a few in flight), so memory stays bounded and a crashed writer leaves
   nothing behind for long.
2. On commit the chunks are made persistent, then one Lua script replaces
   the manifest hash at ``K`` (a single key: atomic on a cluster too) and
   returns the previous generation.
3. The previous generation's chunks are deleted. A reader pinned to it then
   gets :class:`~tensorstream.errors.ObjectChangedError`, never a mix.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ...errors import ObjectChangedError
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
        persisted = await self._p.pipeline([("persist", (k,)) for k in self._keys])
        if not all(persisted):
            raise ObjectChangedError(
                f"staged chunks of {self._path!r} vanished before commit (expired or deleted)"
            )
        fields = manifest_fields(size=self._size, chunk_size=self._cs, generation=self._gen,
                                 checksum=f"sha256:{self._hash.hexdigest()}", mtime=time.time())
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
