"""Listing: turn the keys under a prefix into objects (manifests, tensorizer prefixes, strings).

One ``SCAN`` (glob characters in the prefix escaped) and pipelined
``TYPE``/``HGETALL``/``STRLEN``; chunk keys of a manifest, and chunks a
write staged and has not published, are never listed as objects of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ...errors import ProtocolError
from ..base import display_listing, listing_keeps_damaged
from .layout import (
    Layout,
    chunk_offset,
    escape_glob,
    is_staged_chunk,
    parse_manifest,
    string_layout,
    tensorizer_layout,
)

if TYPE_CHECKING:
    from .provider import RedisProvider

__all__ = ["Damaged", "list_objects"]

log = logging.getLogger("tensorstream.redis")
_HEADER = b":header:0"


def _name(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


def _owner(chunk: bytes) -> bytes:
    """The object key of a chunk key ``K:<generation>:<offset>``."""
    return chunk.rsplit(b":", 2)[0]


def _skip(key: bytes, exc: ProtocolError) -> None:
    # One lying entry must not hide the rest of what `ls` shows; it is named, and
    # reading it still fails loudly.
    log.warning("skipping %r in the listing: %s", _name(key), exc)


class Damaged:
    """An object whose keys make no sense (:data:`~..base.listing_keeps_damaged`).

    ``keys``: the keys that are its own by the rules this listing applies (a manifest
    key and the chunks named for it, a ``to_redis`` prefix's keys, a string key), what a
    delete removes; ``manifest``: the fields of its manifest key, if it has one."""

    def __init__(self, key: bytes, error: ProtocolError, keys: Iterable[bytes] = (),
                 manifest: Mapping[bytes, bytes] | None = None) -> None:
        self.path, self.error = _name(key), error
        self.keys, self.manifest = [key, *keys] if manifest is not None else list(keys), manifest


async def list_objects(p: RedisProvider, prefix: str) -> list[Layout | Damaged]:
    """Every object whose path starts with ``prefix``, sorted by path; a damaged one
    fails the listing, is left out with a warning (``display_listing``) or is given as
    :class:`Damaged` (``listing_keeps_damaged``)."""
    damaged: list[Damaged] = []

    def refuse(key: bytes, exc: ProtocolError, mine: bool = True, keys: Iterable[bytes] = (),
               manifest: Mapping[bytes, bytes] | None = None) -> None:
        # (not ``mine``: a chunk's owner above the prefix, no entry of this listing)
        if mine and listing_keeps_damaged.get():
            damaged.append(Damaged(key, exc, keys, manifest))
        elif display_listing.get():
            _skip(key, exc)
        else:
            raise exc  # a listing without it: sync --delete would remove its copy

    keys = set(await p.scan(escape_glob(prefix) + "*"))
    chunky = {k for k in keys if chunk_offset(k) is not None}
    # A tensorstream chunk K:<generation>:<offset> belongs to the manifest K.
    owners = {k.rsplit(b":", 2)[0] for k in chunky if k.count(b":") >= 2}
    probe = sorted(keys | owners)
    types = dict(zip(probe, await p.pipeline([("type", (k,)) for k in probe]), strict=True))
    hashes = [k for k in probe if types[k] == b"hash"]
    manifests: dict[bytes, Layout] = {}
    for k, fields in zip(hashes, await p.pipeline([("hgetall", (k,)) for k in hashes]),
                             strict=True):
        try:
            manifests[k] = parse_manifest(_name(k), fields)
        except ProtocolError as exc:
            if b"tensorstream" not in fields:
                continue  # a hash of the user's own, not an object
            refuse(k, exc, mine=k in keys, manifest=fields)
    found = [lay for k, lay in manifests.items() if k in keys]
    # A chunk of a manifest is K:<generation>:<offset> (a stale one of an older generation
    # too); any other K:... beside it (K:1, K:v2:3) is a key of its own, listed.
    of_manifest = {k for k in chunky if _owner(k) in manifests
                   and is_staged_chunk(_name(_owner(k)), k)}
    loose = sorted(k for k in chunky if _owner(k) not in manifests)
    # A chunk a writer staged (K:<generation>:<offset> with its staging expiry) is no
    # object until a manifest names it, as stat has it: a write in progress, or one
    # that died, was listed (and copied by cp -r/sync) as one object per chunk.
    staged = [k for k in loose if is_staged_chunk(_name(_owner(k)), k)]
    orphans: set[bytes] = set()
    if staged:
        ttls = await p.pipeline([("pttl", (k,)) for k in staged])
        # Persistent ones are no object either, unless they are tensors of a tensorizer
        # prefix (its P:header:0 beside them): they outlived their manifest (evicted,
        # or a delete or commit cut short), and stat finds no object there.
        orphans = {k for k, ttl in zip(staged, ttls, strict=True)
                   if not (isinstance(ttl, int) and ttl >= 0) and _owner(k) + _HEADER not in keys}
        for owner in sorted({_owner(k) for k in orphans}):
            log.warning("not listing chunks of %r: no manifest names them (evicted by "
                        "maxmemory-policy, or a write or delete was interrupted)", _name(owner))
        hidden = orphans | {k for k, ttl in zip(staged, ttls, strict=True)
                            if isinstance(ttl, int) and ttl >= 0}
        loose = [k for k in loose if k not in hidden]
        keys -= hidden
    for d in damaged:  # a damaged manifest's own chunks: persistent, named for it
        if d.manifest is not None:
            d.keys += sorted(k for k in orphans if _owner(k) == d.keys[0])

    # tensorizer's to_redis prefixes are recognised by their P:header:0 key.
    heads = sorted((k[: -len(_HEADER)] for k in loose if k.endswith(_HEADER)), key=len,
                   reverse=True)
    groups: dict[bytes, list[bytes]] = {h: [] for h in heads if types.get(h, b"none") == b"none"}
    claimed: set[bytes] = set()
    for k in loose:
        for h in heads:
            if h in groups and k.startswith(h + b":"):
                groups[h].append(k)
                claimed.add(k)
                break
    strings = sorted(k for k in keys if types.get(k) == b"string" and k not in claimed
                     and k not in of_manifest)
    sized = [k for g in groups.values() for k in g] + strings
    sizes = dict(zip(sized, await p.pipeline([("strlen", (k,)) for k in sized]), strict=True))
    for h, members in groups.items():
        try:
            lay = tensorizer_layout(_name(h), [(k, sizes[k]) for k in members])
        except ProtocolError as exc:
            refuse(h, exc, mine=_name(h).startswith(prefix), keys=members)
            continue
        if lay is not None and lay.path.startswith(prefix):
            found.append(lay)
    for k in strings:
        try:
            found.append(string_layout(_name(k), sizes[k]))
        except ProtocolError as exc:
            refuse(k, exc, keys=(k,))
    every: list[Layout | Damaged] = [*found, *damaged]
    every.sort(key=lambda lay: lay.path)
    return every
