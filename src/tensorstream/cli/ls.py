"""``tensorstream ls URI``: list objects like ``aws s3 ls`` (``ls s3://``: the buckets).

Names are escaped (a key holding terminal escape sequences or a newline
prints as ``\x1b[2J`` / ``\n``, a backslash as ``\\\\``, so neither passes for the
other); ``--json`` prints each name exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import stat as stat_mod
import sys
from collections.abc import AsyncIterator
from typing import Any

from ..api import get_provider
from ..copy.keys import is_temp_name
from ..copy.select import walk_local
from ..copy.wildcards import wildcard
from ..errors import NotFoundError, TensorstreamError
from ..providers.base import ObjectInfo, display_listing
from ..uri import ParsedURI, parse_uri, redact_text, windows_path_hint
from .options import add_storage_options
from .output import escape_name, human_size

EPILOG = """\
examples:
  tensorstream ls s3://                     # the buckets these credentials see
  tensorstream ls s3://models/              # top level: objects and PRE prefixes/
  tensorstream ls -lr s3://models/llama/    # every object below, with sizes and dates
  tensorstream ls 's3://models/*/config.json'  # wildcards: '*' (also across '/'), '?'
  tensorstream ls -lh /models/llama           # human sizes
  tensorstream ls -rh --summarize s3://models/llama/   # and the total, as aws s3 ls
  tensorstream ls --json s3://models/llama/   # one JSON object per line, names exact
  tensorstream ls redis://localhost:6379/llama/"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "ls", parents=[common], help="list objects under a directory or prefix", add_help=False,
        usage="tensorstream ls [options] URI", epilog=EPILOG,
        description="List objects under URI (a directory, a prefix, or a key prefix). "
                    "Without -r, deeper keys are shown once as 'PRE name/'.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("uri", metavar="URI")
    p.add_argument("-l", "--long", action="store_true", help="show sizes and modification times")
    p.add_argument("-r", "--recursive", action="store_true", help="list every object below")
    p.add_argument("--help", action="help", help="show this help message and exit")
    p.add_argument("-h", "--human-readable", action="store_true",
                   help="sizes as 1.5 KiB, 3.20 GiB (with -l)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: key, size, etag, mtime (or prefix)")
    p.add_argument("--raw", dest="wildcards", action="store_false",
                   help="take '*' and '?' in URI literally (no wildcard matching)")
    p.add_argument("--summarize", action="store_true",
                   help="end with the number and total size of the objects listed (as aws s3 ls)")
    add_storage_options(p)
    p.set_defaults(handler=run)


def list_base(raw: str, uri: ParsedURI) -> tuple[str, str]:
    """``(prefix to list, base that shown names are relative to)``."""
    path = uri.path
    if uri.scheme == "file":
        if os.path.isdir(path):
            return path, path.rstrip("/") + "/"
        return path, os.path.dirname(path).rstrip("/") + "/"
    if uri.scheme == "s3" and "/" not in path:
        return path + "/", path + "/"
    if raw.endswith("/") or not path:
        return path, path
    cut = path.rfind("/") + 1
    return path, path[:cut]


def _line(info: ObjectInfo, name: str, long: bool, human: bool) -> str:
    if not long:
        return escape_name(name)
    when = info.mtime.strftime("%Y-%m-%d %H:%M:%S") if info.mtime else " " * 19
    size = human_size(info.size) if human else str(info.size)
    return f"{when} {size:>12} {escape_name(name)}"


def _json(info: ObjectInfo, name: str) -> str:
    return json.dumps({"key": name, "size": info.size, "etag": info.etag,
                       "mtime": info.mtime.isoformat() if info.mtime else None}, sort_keys=True)


async def _buckets(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """``ls s3://``: the buckets, like ``aws s3 ls``."""
    # The provider does not depend on the bucket; the name is only there to parse.
    async with get_provider(parse_uri("s3://any-bucket/"), **options) as provider:
        lister = getattr(getattr(provider, "inner", provider), "list_buckets", None)
        if lister is None:
            raise NotFoundError("this S3 provider cannot list buckets")
        for name, created in await lister():
            if args.json:
                print(json.dumps({"bucket": name, "created": created.isoformat()
                                  if created else None}, sort_keys=True))
            else:
                when = created.strftime("%Y-%m-%d %H:%M:%S") if created else " " * 19
                print(f"{when} {escape_name(name)}")
    return 0


def _one_level(top: str) -> list[tuple[str, bool]]:
    """``[(name, is a directory)]`` of what ``ls`` (no ``-r``) shows in the local
    directory ``top``, sorted: regular files and directories, symbolic links
    followed as ``cp -r`` follows them; tensorstream's temp files, broken links and
    special files left out. Nothing below ``top`` is read."""
    out = []
    for name in sorted(os.listdir(top)):
        if is_temp_name(name):
            continue
        try:
            st = os.stat(os.path.join(top, name))
        except OSError:
            continue  # a broken link, or gone since the listing
        if stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode):
            out.append((name, stat_mod.S_ISDIR(st.st_mode)))
    return out


async def _listing(provider: Any, uri: ParsedURI, prefix: str,
                   recursive: bool = True) -> AsyncIterator[ObjectInfo]:
    """The objects under ``prefix``; a local directory as ``cp -r`` sees it: symbolic
    links followed (the provider lists regular files only, so a Hugging Face snapshot,
    all links into ``blobs/``, was "no objects" while ``cp -r`` copied every file).
    Not ``recursive``, a local directory's subdirectories come as ``name/`` entries
    (size 0), unread: the whole tree was walked first (``ls /``: every file of the
    machine before the first line)."""
    if uri.scheme == "file" and not recursive and os.path.isdir(prefix):
        top = prefix.rstrip("/") + "/"
        for name, is_dir in await asyncio.to_thread(_one_level, prefix):
            if is_dir:
                yield ObjectInfo(path=top + name + "/", size=0)
                continue
            try:
                info = await provider.stat(top + name)
            except (TensorstreamError, OSError):
                continue  # gone since the listing
            yield dataclasses.replace(info, path=top + name)
        return
    if not recursive and uri.scheme != "file" and hasattr(
            getattr(provider, "inner", provider), "list_level"):
        # S3: one level (Delimiter=/), as aws s3 ls asks; listing every key below
        # took minutes before the first line under a prefix of a million keys.
        async for info in provider.list_level(prefix):
            yield info
        return
    if uri.scheme != "file" or not os.path.isdir(prefix):
        listed = False
        async for info in provider.list(prefix):
            listed = listed or info.path == prefix
            yield info
        if uri.scheme == "file" and not listed and os.path.islink(prefix) and (
                os.path.isfile(prefix)):
            yield await provider.stat(prefix)  # `ls snapshot/config.json`, a link to a blob
        return
    files, _ = await asyncio.to_thread(walk_local, prefix)  # skipped entries: cp reports them
    top = prefix.rstrip("/") + "/"
    for key, path in files:
        try:
            info = await provider.stat(path)
        except (TensorstreamError, OSError):
            continue  # gone since the walk
        # Named by where it is in the tree (a link's own name), not where it points.
        yield dataclasses.replace(info, path=top + key)


def _whole_store(uri: ParsedURI) -> bool:
    """Whether ``uri`` names a whole bucket or Redis database (no key, no prefix)."""
    if uri.scheme in ("s3", "s3a"):
        return "/" not in uri.path.rstrip("/")
    return uri.scheme in ("redis", "rediss") and not uri.path


def run(args: argparse.Namespace) -> int:
    from ._run import print_error, run_async
    from .options import storage_options

    options = storage_options(args)
    if args.uri.rstrip("/") in ("s3:", "s3:/"):
        return run_async(lambda: _buckets(args, options))
    uri = parse_uri(args.uri)

    pattern = wildcard(uri) if args.wildcards else None

    async def go() -> int:
        display_listing.set(True)  # (this task only) shown: a lying entry may be skipped
        prefix, base = list_base(args.uri, uri) if pattern is None else (
            pattern.prefix, pattern.base)
        recursive = args.recursive or pattern is not None  # '*' matches across '/'
        async with get_provider(uri, **options) as provider:
            seen_dirs: set[str] = set()
            count = listed = total = 0
            missing: NotFoundError | None = None
            try:
                async for info in _listing(provider, uri, prefix, recursive):
                    rel = (pattern.relative(info.path) if pattern is not None
                           else info.path[len(base):] if info.path.startswith(base) else None)
                    if rel is None:
                        continue
                    count += 1
                    if not recursive and "/" in rel:
                        d = rel.split("/", 1)[0] + "/"
                        if d not in seen_dirs:
                            seen_dirs.add(d)
                            pad = " " * 32 if args.long else ""
                            if args.json:
                                print(json.dumps({"prefix": d}))
                            else:
                                print(f"{pad}PRE {escape_name(d)}" if args.long
                                      else escape_name(d))
                        continue
                    listed += 1
                    total += info.size
                    print(_json(info, rel) if args.json else _line(
                        info, rel, args.long, args.human_readable))
            except NotFoundError as exc:  # a bucket that does not exist says so
                count, missing = 0, exc
            sys.stdout.flush()
            if count == 0 and missing is None and pattern is None and uri.scheme == "file" and (
                    not os.path.lexists(uri.path)):  # a typo, not an empty directory
                print_error(f"no such file or directory: {redact_text(os.path.normpath(uri.path))}"
                            f"{windows_path_hint(uri.path)}", [args.uri])
                return 1
            if count == 0 and missing is None and pattern is None and _whole_store(uri):
                # An empty bucket (or Redis database) is there and empty: aws s3 ls
                # exits 0 for it, 1 only for a key or prefix that matches nothing; a
                # script's `ls s3://b || create it` took an empty bucket for none.
                count = 1
            if count == 0:
                print_error(str(missing) if missing is not None
                            else f"no object matches {redact_text(args.uri)}" if pattern
                            else f"no objects at {redact_text(args.uri)}", [args.uri])
                return 1
            if args.summarize:  # the objects shown (not those under a PRE line), as aws counts
                if args.json:
                    print(json.dumps({"total_objects": listed, "total_size": total}))
                else:
                    size = human_size(total) if args.human_readable else f"{total}"
                    print(f"\nTotal Objects: {listed}\n   Total Size: {size}")
        return 0

    return run_async(go)
