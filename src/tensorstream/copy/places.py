"""Whether the two sides of a copy are one store, and whether DST lies inside SRC.

``--src-*``/``--dst-*`` options (``src_options``/``dst_options``) let each side
have its own endpoint and credentials, but most of them name no other store: a
profile per side (a read-only and a read-write key of one account), a region, a
CA bundle, a password, or the very endpoint the other side uses. Taken for two
stores, ``cp s3://b/k s3://b/k`` rewrote the object from itself and ``sync
--delete`` of a prefix into the prefix above it deleted the source. What places
an object is its scheme, its server or bucket, and for S3 the endpoint the options
resolve to (a profile's ``endpoint_url`` and the environment included; its buckets
are one store, which copies between them itself). A server
written two ways (``127.0.0.1`` and ``localhost``, ``:80`` or not) is one: :mod:`.servers`.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import TensorstreamError
from ..uri import ParsedURI
from .select import Rules
from .servers import Server, endpoint_server, same_server, server

__all__ = ["connection", "feeds_itself", "inside", "leads_into", "same_store", "way_out"]

#: Schemes whose URI's host and port name the server (options only say how to reach it).
_HOSTED = frozenset({"redis", "rediss", "http", "https"})
_REDIS = frozenset({"redis", "rediss"})


def connection(uri: ParsedURI) -> tuple[Any, ...]:
    """What of ``uri`` configures the provider made from it: the host, the user and
    password of its userinfo and, for Redis, its query (``?db=2``, ``?cluster=``).
    Sources sharing one provider by host alone were read from the first one's
    database with the first one's user (``redis://h/b?db=2`` copied database 1's ``b``)."""
    query = tuple(sorted(uri.query.items())) if uri.scheme in _REDIS else ()
    return (uri.scheme, uri.netloc, uri.username, uri.password, query)


def same_store(src: ParsedURI, dst: ParsedURI, src_options: Mapping[str, Any],
               dst_options: Mapping[str, Any]) -> bool:
    """Whether ``src`` and ``dst`` (with each side's whole options) are on one store."""
    if src.scheme != dst.scheme:
        return False
    if src.scheme in _HOSTED:
        if not same_server(_uri_server(src), _uri_server(dst)):
            return False
        # one server, two databases
        return src.scheme not in _REDIS or _redis_db(src, src_options) == _redis_db(
            dst, dst_options)
    if src.netloc != dst.netloc and src.scheme not in ("s3", "s3a"):
        return False  # (an S3 URI's netloc is its bucket, and its path starts with it:
        # two buckets of one endpoint are one store, which copies between them itself)
    if src.scheme == "file" or src_options == dst_options:
        return True
    if src.scheme in ("s3", "s3a"):
        here, there = _s3_endpoint(src_options), _s3_endpoint(dst_options)
        if here is None or there is None:
            return here is there  # AWS both (a bucket's name is global), or AWS and another
        return (isinstance(here, Server) and isinstance(there, Server)
                and same_server(here, there))
    return False  # another fsspec store: its options may well name another one


def _uri_server(uri: ParsedURI) -> Server:
    """The server an HTTP(S) or Redis URI names."""
    return server(uri.scheme, uri.host or "", uri.port)


def _s3_endpoint(options: Mapping[str, Any]) -> Server | TensorstreamError | None:
    """The endpoint an S3 provider made from ``options`` would send requests to (None:
    AWS, where a bucket's name is global); a configuration error, or an endpoint that
    names no server, is never one with another (the copy reports it)."""
    from ..providers.s3.config import normalize_endpoint, resolve_s3_credentials

    try:
        endpoint = resolve_s3_credentials(options).endpoint
    except TensorstreamError as exc:
        return exc
    if endpoint is None:
        return None
    found = endpoint_server(normalize_endpoint(endpoint.value))
    if found is not None and not found.path.strip("/") and _AWS_S3_HOST(found.host):
        # AWS's own endpoint named (``--src-endpoint-url https://s3.amazonaws.com``, as
        # cp --help shows): AWS still, whatever region or form. Taken for another store,
        # ``sync --delete`` of a prefix under DST deleted its source.
        return None
    return TensorstreamError("no server") if found is None else found


#: AWS's S3 endpoints (global, regional, ``s3-REGION``, dual-stack, FIPS, China): a bucket's
#: name is global there. (Not an access point's, an Outpost's or S3 Express's zonal ones.)
_AWS_S3_HOST = re.compile(
    r"s3(?:[.-](?:fips|dualstack|[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d))*"
    r"\.amazonaws\.com(?:\.cn)?\.?", re.IGNORECASE).fullmatch


def _redis_db(uri: ParsedURI, options: Mapping[str, Any]) -> str:
    """The database a Redis URI with ``options`` names (the option over the URI's query)."""
    db = options.get("redis_db")
    return str(uri.query.get("db", 0) if db is None else db).lstrip("0") or "0"


def inside(path: str, directory: str) -> str:
    """``path`` relative to ``directory`` where it lies below it (symlinks resolved), else
    ``""`` (the same directory by a bind mount counts, and so does a bind mount below
    ``directory`` holding ``path``); a directory onto itself is refused per file (same
    object), so only below counts."""
    if not os.path.isdir(directory):
        return ""
    top, below = os.path.realpath(directory), os.path.realpath(path)
    if below == top:
        return ""
    if os.path.commonpath([top, below]) == top:
        return os.path.relpath(below, top).replace(os.sep, "/")
    # The same directory by another path (a bind mount, as a container's volume often is):
    # no realpath says so, its device and inode do. One stat per directory above DST.
    rel = _up_to(below, top)
    if rel is not None:
        return rel  # (DST itself: "", a directory onto itself, refused per file)
    # Or a mount point below ``directory`` holds it (/out mounted again at SRC/mnt; SRC
    # mounted again at DST/sub): SRC's listing holds DST's files there.
    for point in _mount_points():
        if point == top or os.path.commonpath([top, point]) != top:
            continue
        rel = _up_to(below, point)
        if rel is not None:
            return "/".join(x for x in (os.path.relpath(point, top).replace(os.sep, "/"), rel)
                            if x)
    return ""


def _up_to(below: str, top: str) -> str | None:
    """``below`` relative to the directory ``top`` where one of the directories up from
    ``below`` (itself included: ``""``) is ``top`` by device and inode, else None."""
    try:
        itself = os.stat(top)
    except OSError:
        return None
    names: list[str] = []
    here = below
    while True:
        try:
            if os.path.samestat(os.stat(here), itself):
                return "/".join(reversed(names))
        except OSError:
            pass  # (not made yet: DST on a first run)
        parent = os.path.dirname(here)
        if parent == here:
            return None
        names.append(os.path.basename(here))
        here = parent


def _mount_points() -> list[str]:
    """Every mount point of this process's namespace (none where it has no mountinfo)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    # (the 5th field, its space, tab, newline and backslash written as \ooo octal)
    return [os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), fields[4]))
            for fields in (line.split(b" ") for line in lines) if len(fields) > 4]


def feeds_itself(rules: Rules, rel: str, keys: Iterable[str],
                 matches: Callable[[str], bool] | None = None) -> str | None:
    """The first of ``keys`` (SRC's keys, relative to it) that makes a copy into SRC's
    own ``rel`` read what it writes, else ``None``: one selected now although it lies
    under ``rel``/ (an earlier run's copy, copied a level deeper), or one whose copy
    there (``rel/KEY``) ``rules`` would select on the next run. ``rules`` decide as
    they do for every key (:meth:`Rules.wants`), so any rules that leave DST out of SRC
    let the copy run (``rel/*``, ``rel/**``, ``rel*``, an ``--include`` of other keys
    after them), as rclone lets overlapping remotes be synced on that condition.
    ``matches``: whether SRC's wildcard matches a key (None: SRC names every key under it)."""
    below = rel + "/"
    for key in keys:
        if not rules.wants(key):
            continue
        if key.startswith(below) or (rules.wants(below + key) and (
                matches is None or matches(below + key))):
            return key
    return None


def leads_into(dst: str, src: str, files: Iterable[tuple[str, str]]) -> str | None:
    """The first key of ``files`` (``(key, path)`` under the local directory ``src``)
    whose directory is inside ``dst`` by a symbolic link (``src/cache -> ../out``, ``cp -r
    src out``), else ``None``: each run would copy the last run's copies again, a level
    deeper. ``None`` where DST is SRC or above it (a directory into its parent)."""
    if not os.path.isdir(dst):
        return None
    top, into = os.path.realpath(src), os.path.realpath(dst)
    if os.path.commonpath([top, into]) == into:
        return None
    found: dict[str, bool] = {}  # a realpath per directory, not per file
    for key, path in files:
        where = os.path.dirname(path)
        if where not in found:
            real = os.path.realpath(where)
            found[where] = real == into or real.startswith(into.rstrip(os.sep) + os.sep)
        if found[where]:
            return key
    return None


def way_out(rel: str) -> str:
    """What to do instead of copying SRC into its own ``rel``: an ``--exclude`` that
    leaves it out, where one can (no pattern names an empty segment: ``s3://b/p//x/``
    under ``s3://b/p/`` is ``/x``, and ``--exclude '/x/*'`` is refused).

    >>> way_out("bk").endswith("--exclude 'bk/*'"), "--exclude" in way_out("/x")
    (True, False)
    """
    if "" in rel.split("/"):
        return ("each run would copy the last run's copies a level deeper: copy to a place "
                "outside SRC (DST's keys there have an empty segment, which no pattern "
                "can name)")
    exclude = shlex.quote(glob.escape(rel) + "/*")
    return ("each run would copy the last run's copies a level deeper: copy to a place "
            f"outside SRC, or leave DST out of SRC with --exclude {exclude}")
