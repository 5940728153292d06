"""``tensorstream stat | cat | rm | credentials``: one object at a time."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ..api import get_provider
from ..errors import NotFoundError
from ..providers.base import ObjectInfo
from ..uri import parse_uri, redact_text
from .options import add_storage_options, storage_options

_CHUNK = 8 << 20


def _sub(sub: Any, common: argparse.ArgumentParser, name: str, help_: str, usage: str,
         epilog: str, description: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, parents=[common], help=help_, usage=usage, epilog=epilog,
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("uri", metavar="URI")
    return p


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = _sub(sub, common, "stat", "size, ETag and modification time of an object",
             "tensorstream stat [options] URI",
             "examples:\n  tensorstream stat s3://models/llama/model.tensors\n"
             "  tensorstream stat --json https://host/model.tensors",
             "Show the size, ETag, version and modification time of one object.")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_storage_options(p)
    p.set_defaults(handler=run_stat)

    p = _sub(sub, common, "cat", "write an object (or a byte range) to stdout",
             "tensorstream cat [options] URI",
             "examples:\n  tensorstream cat s3://models/config.json\n"
             "  tensorstream cat --range 0-1023 s3://models/model.tensors | xxd\n"
             "  tensorstream cat --range -64 https://host/model.tensors   # last 64 bytes",
             "Write the object to stdout. --range takes HTTP-style inclusive byte ranges: "
             "A-B, A- (to the end) or -N (the last N bytes).")
    p.add_argument("--range", dest="byte_range", metavar="A-B", help="bytes A..B inclusive")
    add_storage_options(p)
    p.set_defaults(handler=run_cat)

    p = _sub(sub, common, "rm", "delete an object (or, with -r, every object under a prefix)",
             "tensorstream rm [options] URI",
             "examples:\n  tensorstream rm s3://models/old/model.tensors\n"
             "  tensorstream rm -r s3://models/old/",
             "Delete one object, or with -r every object under a directory or prefix.")
    p.add_argument("-r", "--recursive", action="store_true", help="delete everything under URI")
    add_storage_options(p)
    p.set_defaults(handler=run_rm)

    p = _sub(sub, common, "credentials", "show which credentials would be used, and from where",
             "tensorstream credentials [options] URI",
             "examples:\n  tensorstream credentials s3://models/\n"
             "  AWS_PROFILE=prod tensorstream credentials --json s3://models/",
             "Resolve credentials for URI exactly as cp would and show where each value "
             "came from. Secrets are masked.")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_storage_options(p)
    p.set_defaults(handler=run_credentials)


def _info_dict(info: ObjectInfo, uri: str) -> dict[str, Any]:
    return {"uri": redact_text(uri), "size": info.size, "etag": info.etag,
            "version": info.version,
            "mtime": info.mtime.isoformat() if info.mtime else None}


def run_stat(args: argparse.Namespace) -> int:
    from ._run import run_async

    uri = parse_uri(args.uri)

    async def go() -> int:
        async with get_provider(uri, **storage_options(args)) as provider:
            info = await provider.stat(uri.path)
        d = _info_dict(info, args.uri)
        if args.json:
            print(json.dumps(d, sort_keys=True))
        else:
            for k in ("uri", "size", "etag", "version", "mtime"):
                if d[k] is not None:
                    print(f"{k + ':':<9}{d[k]}")
        return 0

    return run_async(go)


_RANGE = re.compile(r"^(\d*)-(\d*)$")


def parse_range(text: str, size: int) -> tuple[int, int]:
    """HTTP-style inclusive ``A-B`` / ``A-`` / ``-N`` -> ``[start, end)``."""
    m = _RANGE.match(text.strip())
    if not m or (not m.group(1) and not m.group(2)):
        raise argparse.ArgumentTypeError(f"--range must be A-B, A- or -N, got {text!r}")
    a, b = m.group(1), m.group(2)
    if not a:
        return max(0, size - int(b)), size
    start = int(a)
    end = min(size, int(b) + 1) if b else size
    if (start >= size and size > 0) or end < start:
        raise argparse.ArgumentTypeError(f"--range {text} is outside the {size}-byte object")
    return start, end


def run_cat(args: argparse.Namespace) -> int:
    from ._run import run_async

    uri = parse_uri(args.uri)

    async def go() -> int:
        async with get_provider(uri, **storage_options(args)) as provider:
            info = await provider.stat(uri.path)
            start, end = (0, info.size) if not args.byte_range else parse_range(
                args.byte_range, info.size)
            buf = bytearray(min(_CHUNK, max(end - start, 1)))
            out = sys.stdout.buffer
            pos = start
            while pos < end:
                view = memoryview(buf)[: min(len(buf), end - pos)]
                await provider.readinto(uri.path, pos, view, etag=info.etag)
                out.write(view)
                pos += len(view)
            out.flush()
        return 0

    return run_async(go)


def run_rm(args: argparse.Namespace) -> int:
    from ._run import print_error, run_async

    uri = parse_uri(args.uri)

    async def go() -> int:
        async with get_provider(uri, **storage_options(args)) as provider:
            if not args.recursive:
                await provider.delete(uri.path)
                return 0
            base = uri.path.rstrip("/") + "/"
            targets = [i.path async for i in provider.list(base)
                       if i.path.startswith(base)]
            if not targets:
                raise NotFoundError(f"no objects under {redact_text(args.uri)}")
            failed = 0
            for path in targets:
                try:
                    await provider.delete(path)
                except (OSError, ValueError) as exc:
                    failed += 1
                    print_error(str(exc))
            return 1 if failed else 0

    return run_async(go)


def run_credentials(args: argparse.Namespace) -> int:
    try:
        from ..credentials.describe import describe_credentials
    except ImportError as exc:
        raise NotFoundError(f"credential description is not available: {exc}") from exc
    report = describe_credentials(args.uri, **storage_options(args))
    if args.json:
        as_dict = getattr(report, "as_dict", None) or getattr(report, "to_dict", None)
        data = as_dict() if callable(as_dict) else report
        print(redact_text(json.dumps(data, sort_keys=True, default=str)))
    else:
        print(redact_text(str(report)))
    return 0
