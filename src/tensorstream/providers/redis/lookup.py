"""What a Redis path holds: a tensorstream manifest, a plain string, or a prefix
written by tensorizer's ``to_redis`` (:mod:`.layout` describes each)."""

from __future__ import annotations

from ...errors import NotFoundError
from .connection import RedisConnection
from .errors import map_redis_error
from .layout import (
    Layout,
    escape_glob,
    is_staged_chunk,
    parse_manifest,
    string_layout,
    tensorizer_layout,
)

__all__ = ["key_bytes", "look_up", "scan_tensorizer"]

_HEADER = b":header:0"


def key_bytes(path: str) -> bytes:
    """Redis key for an object path (UTF-8; undecodable bytes round-trip)."""
    return path.encode("utf-8", "surrogateescape")


async def look_up(conn: RedisConnection, path: str) -> Layout:
    """Find the object at ``path``: manifest, plain string or tensorizer prefix."""
    key = key_bytes(path)
    kind, fields, length = await conn.pipeline(
        [("type", (key,)), ("hgetall", (key,)), ("strlen", (key,))], raise_on_error=False
    )
    for reply in (kind, fields, length):
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise map_redis_error(reply, who=conn._creds.describe(looked_in=True),
                                  secrets=conn._creds.secrets()) from reply
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind == "hash" and isinstance(fields, dict) and fields:
        layout = parse_manifest(path, fields)
    elif kind == "string" and isinstance(length, int):
        layout = string_layout(path, length)
    elif kind in ("none", None) or (kind == "hash" and not fields):
        layout = await _resolve_tensorizer(conn, path)
    else:
        raise NotFoundError(f"key {path!r} holds a Redis {kind}, not an object")
    return layout


async def _resolve_tensorizer(conn: RedisConnection, path: str) -> Layout:
    layout, leftover = await scan_tensorizer(conn, path)
    if layout is None:
        why = ""
        if leftover:
            why = (f"; {len(leftover)} chunk(s) of a tensorstream object remain under "
                   f"{path!r}:<generation>:<offset> with no manifest naming them (evicted "
                   "by maxmemory-policy, or a delete or commit was interrupted): "
                   "'tensorstream rm' removes them")
        raise NotFoundError(f"no such Redis object: {path!r}{why}")
    return layout


async def scan_tensorizer(conn: RedisConnection, path: str) -> tuple[Layout | None, list[bytes]]:
    """The tensorizer prefix at ``path`` (or ``None``), and the persistent chunks
    of a tensorstream object whose manifest is gone (never part of it).

    Its keys are told apart as a listing does (:mod:`.lister`): a prefix is one only
    with its ``path:header:0`` (tensorizer's ``to_redis`` always writes it), and the
    keys of another object under ``path:`` are not its own: a manifest and the chunks
    named for it, a nested prefix with a header of its own."""
    keys = await conn.scan(escape_glob(path) + ":*")
    answers = await conn.pipeline([("strlen", (k,)) for k in keys]
                                  + [("pttl", (k,)) for k in keys], raise_on_error=False)
    for reply in answers:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise map_redis_error(reply, who=conn._creds.describe(looked_in=True),
                                  secrets=conn._creds.secrets()) from reply
    sizes, ttls = answers[: len(keys)], answers[len(keys):]
    # tensorizer's to_redis always writes K:header:0; a tensor of its own may be
    # named like a generation (16 hex digits), a tensorstream chunk only then.
    head = key_bytes(path)
    tensorizer = head + _HEADER in keys
    others = {k for k, n in zip(keys, sizes, strict=True) if isinstance(n, Exception)}
    nested = [k[: -len(_HEADER)] for k in keys if k.endswith(_HEADER) and k != head + _HEADER]
    sized, leftover = [], []
    for k, n, ttl in zip(keys, sizes, ttls, strict=True):
        if is_staged_chunk(path, k) and (ttl >= 0 or not tensorizer):
            # A chunk a writer staged (with its staging expiry) belongs to no
            # object until a manifest names it: an unpublished write, or one whose
            # abort left it to expire. A persistent one outlived its manifest
            # (evicted, or a delete or commit cut short): only the manifest knew
            # the object's size, and the chunks left, read as a stream, were a
            # shorter object whenever its last chunks were gone too.
            if isinstance(ttl, int) and ttl < 0:
                leftover.append(k)
            continue
        owner = k.rsplit(b":", 2)[0]
        if (k in others or (owner in others and is_staged_chunk(_name(owner), k))
                or any(k.startswith(h + b":") for h in nested)):
            continue  # another object's key (a hash, a manifest's chunk, a nested prefix)
        sized.append((k, n))
    if not tensorizer:
        return None, leftover  # (keys K:... with no K:header:0 are objects of their own)
    return tensorizer_layout(path, sized), leftover


def _name(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")
