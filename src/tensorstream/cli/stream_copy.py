"""``tensorstream cp`` of one object through a stream: ``cp SRC -`` (to stdout, as
``cat``), ``cp - DST`` (stdin into an atomic writer) and ``cp SRC DST`` where DST is a
device, FIFO or socket (written in order, as ``cat SRC > DST``)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import sys
import time
from typing import Any

from ..api import get_provider
from ..errors import ConfigurationError
from ..uri import parse_uri, redact_text
from .objects import CHUNK, write_object

__all__ = ["copy_into_special", "copy_stream"]


def copy_stream(args: argparse.Namespace, sources: list[str], dest: str,
                src_options: dict[str, Any], dst_options: dict[str, Any], meta: Any = None) -> int:
    """``cp SRC -`` (to stdout, like cat) and ``cp - DST`` (stdin into an atomic writer)."""
    from ._run import EXIT_USAGE, print_error, run_async
    from .output import escape, human_size

    if len(sources) != 1 or args.recursive or (sources[0] == "-") == (dest == "-"):
        print_error("'-' copies one object: 'cp SRC -' writes it to stdout, 'cp - DST' "
                    "reads stdin into DST (no -r, one SRC)")
        return EXIT_USAGE
    from ..copy.metadata import stream_writer_options
    try:
        extra = stream_writer_options(meta, "stdout" if dest == "-" else parse_uri(dest).scheme)
    except ConfigurationError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    if dest == "-":
        async def out() -> int:
            await write_object(sources[0], src_options, None)
            return 0

        return run_async(out)
    from ..copy.plan import names_no_object

    if dest.endswith("/") or os.path.isdir(dest) or (
            "://" in dest and names_no_object(parse_uri(dest))):
        print_error(f"'cp - DST' needs DST to name the object, not a directory: {dest}")
        return EXIT_USAGE
    text = not (args.quiet or args.json or args.only_show_errors)
    if args.dryrun:
        if text:
            print(f"(dryrun) copy: - -> {escape(redact_text(dest))}")
        _stream_json(args, dest, "dryrun", 0, 0.0)
        return 0

    async def go() -> int:
        uri = parse_uri(dest)
        total = 0
        read = getattr(sys.stdin.buffer, "read1", sys.stdin.buffer.read)  # what is there
        t0 = time.perf_counter()
        try:
            if uri.scheme == "file":
                # As for 'cp SRC DST': missing directories above a local DST are made.
                _make_parent(uri.path)
            async with get_provider(uri, **dst_options) as provider:
                async with provider.open_writer(uri.path, **extra) as writer:
                    while True:
                        chunk = await asyncio.to_thread(read, CHUNK)
                        if not chunk:
                            break
                        await writer.write(chunk)
                        total += len(chunk)
        except Exception as exc:
            _stream_json(args, dest, "failed", 0, time.perf_counter() - t0,
                         error=f"- -> {redact_text(dest)}: {exc}")
            raise
        if text:
            print(f"copy: - -> {escape(redact_text(dest))}", flush=True)
            print(f"copied 1 file ({human_size(total)}) from stdin", file=sys.stderr)
        _stream_json(args, dest, "copied", total, time.perf_counter() - t0)
        return 0

    return run_async(go, lambda: "nothing was written to the destination")


def copy_into_special(args: argparse.Namespace, source: str, dest: str,
                      src_options: dict[str, Any]) -> int:
    """``cp SRC DST`` where DST is a device, FIFO or socket (``/dev/null``): its bytes
    are written into it in order, as ``cat SRC > DST`` would; a rename would have
    replaced the node itself (``/dev/null``, as root)."""
    from ._run import run_async
    from .output import escape, human_size

    src_uri = parse_uri(source)
    label = src_uri.path if src_uri.scheme == "file" else redact_text(source)
    # Nothing of ours is printed into the bytes when DST is our stdout (/dev/stdout).
    to_stdout = _is_stdout(dest)
    text = not (args.quiet or args.json or args.only_show_errors)
    line = f"copy: {escape(label)} -> {escape(dest)}"

    def report(status: str, size: int, seconds: float, error: str | None = None) -> None:
        if not to_stdout:
            _stream_json(args, dest, status, size, seconds, error=error, src=label)

    if args.dryrun:
        if text and not to_stdout:
            print(f"(dryrun) {line}")
        report("dryrun", 0, 0.0)
        return 0

    async def go() -> int:
        t0, size = time.perf_counter(), 0
        try:
            # O_NONBLOCK: a FIFO without a reader is an error now, not a wait that
            # Ctrl-C cannot end (the open would block a worker thread).
            fd = os.open(dest, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            try:
                os.set_blocking(fd, True)
                with open(fd, "wb", buffering=0, closefd=False) as out:
                    size = await write_object(source, src_options, None, out, what=dest)
            finally:
                os.close(fd)
        except Exception as exc:
            report("failed", 0, time.perf_counter() - t0, f"{label} -> {dest}: {exc}")
            if isinstance(exc, OSError) and exc.errno == errno.ENXIO:
                from ..copy.plan import special_file

                kind = special_file(dest)
                why = "no reader" if kind == "a FIFO" else "it cannot be opened as a file"
                raise OSError(exc.errno, f"{dest} is {kind}: {why}") from None
            raise
        if text:
            if not to_stdout:
                print(line, flush=True)
            print(f"copied 1 file ({human_size(size)}) into {escape(dest)}", file=sys.stderr)
        report("copied", size, time.perf_counter() - t0)
        return 0

    return run_async(go)


def _is_stdout(path: str) -> bool:
    """Whether ``path`` is the file our standard output writes to."""
    try:
        there, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (there.st_dev, there.st_ino) == (out.st_dev, out.st_ino)


def _make_parent(path: str) -> None:
    """Make the directories above a local ``cp - DST``, naming a file in their way."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise OSError(exc.errno, f"the destination directory {parent} cannot be made: a "
                      "file is in its way") from None


def _stream_json(args: argparse.Namespace, dest: str, status: str, size: int, seconds: float,
                 error: str | None = None, src: str = "-") -> None:
    """``--json`` of ``cp - DST`` (and of a copy into a device): the object's line, then
    the summary object every ``cp --json`` ends with (dryrun and failure included)."""
    if not args.json:
        return
    from ..copy.engine import CopyResult
    from .output import human_size

    copied = status == "copied"
    line: dict[str, Any] = {"op": "copy", "src": redact_text(src), "dst": redact_text(dest),
                            "size": size, "status": status, "verified": False,
                            "seconds": round(seconds, 6)}
    if error is not None:
        line["error"] = redact_text(error)
    result = CopyResult(files=int(copied), bytes=size, seconds=seconds, verified=False,
                        errors=[line["error"]] if error is not None else [])
    whence = "from stdin" if src == "-" else f"into {dest}"
    summary = {"copied": f"copied 1 file ({human_size(size)}) {whence}",
               "dryrun": "(dryrun) would copy 1 file", "failed": "1 failed"}[status]
    for obj in (line, {"op": "summary", **result.to_dict(), "summary": summary}):
        print(json.dumps(obj, sort_keys=True), flush=True)
