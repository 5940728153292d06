"""``tensorstream ls URI``: list objects like ``aws s3 ls``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..api import get_provider
from ..errors import NotFoundError
from ..providers.base import ObjectInfo
from ..uri import ParsedURI, parse_uri, redact_text
from .options import add_storage_options

EPILOG = """\
examples:
  tensorstream ls s3://models/              # top level: objects and PRE prefixes/
  tensorstream ls -lr s3://models/llama/    # every object below, with sizes and dates
  tensorstream ls /models/llama
  tensorstream ls redis://localhost:6379/llama/"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "ls", parents=[common], help="list objects under a directory or prefix",
        usage="tensorstream ls [options] URI", epilog=EPILOG,
        description="List objects under URI (a directory, a prefix, or a key prefix). "
                    "Without -r, deeper keys are shown once as 'PRE name/'.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("uri", metavar="URI")
    p.add_argument("-l", "--long", action="store_true", help="show sizes and modification times")
    p.add_argument("-r", "--recursive", action="store_true", help="list every object below")
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


def _line(info: ObjectInfo, name: str, long: bool) -> str:
    if not long:
        return name
    when = info.mtime.strftime("%Y-%m-%d %H:%M:%S") if info.mtime else " " * 19
    return f"{when} {info.size:>12} {name}"


def run(args: argparse.Namespace) -> int:
    from ._run import print_error, run_async
    from .options import storage_options

    uri = parse_uri(args.uri)
    options = storage_options(args)

    async def go() -> int:
        prefix, base = list_base(args.uri, uri)
        async with get_provider(uri, **options) as provider:
            seen_dirs: set[str] = set()
            count = 0
            try:
                async for info in provider.list(prefix):
                    if not info.path.startswith(base):
                        continue
                    rel = info.path[len(base):]
                    count += 1
                    if not args.recursive and "/" in rel:
                        d = rel.split("/", 1)[0] + "/"
                        if d not in seen_dirs:
                            seen_dirs.add(d)
                            pad = " " * 32 if args.long else ""
                            print(f"{pad}PRE {d}" if args.long else d)
                        continue
                    print(_line(info, rel, args.long))
            except NotFoundError:
                count = 0
            sys.stdout.flush()
            if count == 0:
                print_error(f"no objects at {redact_text(args.uri)}")
                return 1
        return 0

    return run_async(go)
