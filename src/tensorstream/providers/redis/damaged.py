"""Deleting a damaged object: one whose keys make no sense (a tensorizer ``to_redis``
prefix with a gap, a tensorstream manifest with impossible numbers), which no read or
delete could look up, so nothing but ``redis-cli`` removed it.

Only its own keys go, as the listing tells them apart (:class:`~.lister.Damaged`): its
manifest and the persistent chunks of its generation (``K:<generation>:<offset>``), or
the keys of its ``to_redis`` prefix. A hash that is no manifest of ours, another object's
keys beside it and a write's staged chunks are never touched."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...errors import ObjectChangedError, ProtocolError
from ..base import listing_keeps_damaged
from .lister import Damaged, list_objects
from .lookup import key_bytes

if TYPE_CHECKING:
    from .provider import RedisProvider

__all__ = ["DELETE_IF_SAME_MANIFEST", "delete_damaged"]

log = logging.getLogger("tensorstream.redis")

#: Delete the manifest KEYS[1] if it still has the ``tensorstream`` and ``generation``
#: fields seen (ARGV[1], ARGV[2]; "" for none): a write that replaced it meanwhile wins.
DELETE_IF_SAME_MANIFEST = """
if redis.call('TYPE', KEYS[1])['ok'] == 'hash'
   and (redis.call('HGET', KEYS[1], 'tensorstream') or '') == ARGV[1]
   and (redis.call('HGET', KEYS[1], 'generation') or '') == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


async def delete_damaged(p: RedisProvider, path: str, error: ProtocolError) -> None:
    """Delete the damaged object at ``path`` (whose lookup failed with ``error``) and
    log what went; ``error`` again when the listing names no damaged object there
    (a hash of the user's own, say: not ours to delete)."""
    token = listing_keeps_damaged.set(True)
    try:
        entries = await list_objects(p, path)
    finally:
        listing_keeps_damaged.reset(token)
    found = next((e for e in entries if isinstance(e, Damaged) and e.path == path), None)
    if found is None:
        raise error
    chunks, others = found.keys, 0
    if found.manifest is not None:
        seen = (found.manifest.get(b"tensorstream", b""), found.manifest.get(b"generation", b""))
        # Only its own generation's chunks: persistent ones of another are those of a write
        # between its PERSIST and its publish as well as a dead one's (no name tells them
        # apart), and the write would publish a manifest whose chunks were deleted. A
        # normal delete leaves them too; ``rm K`` again removes them once K is gone.
        own = key_bytes(path) + b":" + seen[1] + b":"
        mine = [k for k in chunks[1:] if seen[1] and k.startswith(own)]
        others = len(chunks) - 1 - len(mine)
        chunks = [chunks[0], *mine]

        async def drop() -> int:
            return int(await p.client().eval(DELETE_IF_SAME_MANIFEST, 1, key_bytes(path), *seen))

        if not await p._guard(drop):
            raise ObjectChangedError(f"Redis object {path!r} was replaced during delete")
        chunks = chunks[1:]
    await p.delete_keys(chunks)
    what = "its manifest and " if found.manifest is not None else ""
    left = (f"; {others} persistent chunk(s) of another generation left (a write may be "
            f"publishing them; once none is, 'rm' of the name again removes them)"
            if others else "")
    log.warning("deleted the damaged object %r (%s): %s%d key(s)%s", path, error.message,
                what, len(chunks), left)
