"""``tensorstream stat | cat | rm | credentials``: one object at a time."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import errno
import json
import os
import re
import sys
from typing import Any

from ..api import get_provider
from ..copy.wildcards import wildcard
from ..errors import NotFoundError
from ..providers.base import ObjectInfo, Pin
from ..uri import ParsedURI, parse_uri, redact_text
from .options import Rule, add_storage_options, storage_options, unmatchable_rule

#: Bytes of one read or write of an object streamed through (cat, cp with - or a device).
CHUNK = 8 << 20
#: Deletes of ``rm -r`` / ``rm PATTERN`` in flight at once (aws s3 rm runs 10).
_DELETES_IN_FLIGHT = 16


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
             "  tensorstream rm -r --dryrun s3://models/old/\n"
             "  tensorstream rm -r --exclude '*' --include '*.pt' s3://models/old/\n"
             "  tensorstream rm 's3://models/old/*.pt'        # s5cmd's wildcards",
             "Delete one object, or with -r every object under a directory or prefix, or "
             "every object a pattern ('*', '?' in an S3 or Redis key) matches. "
             "Prints one 'delete: URI' line per object removed.")
    p.add_argument("-r", "--recursive", action="store_true", help="delete everything under URI")
    p.add_argument("--dryrun", action="store_true", help="show what would be deleted")
    p.add_argument("--exclude", action=Rule, const="exclude", metavar="GLOB",
                   help="keep keys matching GLOB (repeatable)")
    p.add_argument("--include", action=Rule, const="include", metavar="GLOB",
                   help="take back keys an earlier --exclude left out; the last rule that "
                        "matches wins")
    p.add_argument("--raw", dest="wildcards", action="store_false",
                   help="take '*' and '?' in URI literally (no wildcard matching)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--json", action="store_true", help="one JSON object per object deleted")
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
    from .output import escape, escape_name

    uri = parse_uri(args.uri)

    async def go() -> int:
        async with get_provider(uri, **storage_options(args)) as provider:
            info = await _stat_or_hint(provider, uri, args.uri)
        d = _info_dict(info, args.uri)
        if args.json:
            print(json.dumps(d, sort_keys=True))
        else:
            for k in ("uri", "size", "etag", "version", "mtime"):
                if d[k] is not None:  # (the name as ls shows it: a\\nb is no a<newline>b)
                    print(f"{k + ':':<9}{(escape_name if k == 'uri' else escape)(str(d[k]))}")
        return 0

    return run_async(go)


_RANGE = re.compile(r"^(\d*)-(\d*)$")


def parse_range(text: str, size: int) -> tuple[int, int]:
    """HTTP-style inclusive ``A-B`` / ``A-`` / ``-N`` -> ``[start, end)``."""
    m = _RANGE.match(text.strip())
    if not m or (not m.group(1) and not m.group(2)):
        raise argparse.ArgumentTypeError(f"--range must be A-B, A- or -N, got {text!r}")
    a, b = m.group(1), m.group(2)
    # A range of no bytes is a mistake, not an empty answer (HTTP refuses both: 416).
    if not a:
        if not int(b):
            raise argparse.ArgumentTypeError(f"--range {text} asks for no bytes (-N: the last "
                                             "N bytes, N at least 1)")
        return max(0, size - int(b)), size
    start = int(a)
    if b and int(b) < start:
        raise argparse.ArgumentTypeError(f"--range {text} ends before it starts (A-B takes "
                                         "bytes A to B inclusive, B >= A)")
    end = min(size, int(b) + 1) if b else size
    if (start >= size and size > 0) or end < start:
        raise argparse.ArgumentTypeError(f"--range {text} is outside the {size}-byte object")
    return start, end


async def write_object(uri_text: str, options: dict[str, Any], byte_range: str | None,
                       out: Any = None, what: str = "standard output") -> int:
    """Write the object (or ``byte_range`` of it) to ``out`` (stdout) in order, every
    read pinned to the version first seen; returns the bytes written."""
    uri = parse_uri(uri_text)
    out = sys.stdout.buffer if out is None else out
    async with get_provider(uri, **options) as provider:
        info = await _stat_or_hint(provider, uri, uri_text)
        start, end = (0, info.size) if not byte_range else parse_range(byte_range, info.size)
        buf = bytearray(min(CHUNK, max(end - start, 1)))
        pos = start
        while pos < end:
            view = memoryview(buf)[: min(len(buf), end - pos)]
            await provider.readinto(uri.path, pos, view, pin=Pin.of(info))
            _write_all(out, view, what)
            pos += len(view)
        out.flush()
    return end - start if byte_range else info.size


def _write_all(out: Any, view: memoryview, what: str = "standard output") -> None:
    """Write all of ``view``: a raw write that takes part of it (a file size limit
    reached, RLIMIT_FSIZE) returns a short count, and the next write raises, so
    the rest is never dropped while the command exits 0."""
    while view:
        try:
            n = out.write(view)
        except BrokenPipeError:
            raise  # the reader left: a quiet exit (see main)
        except OSError as exc:
            raise OSError(exc.errno, f"writing {what}: {exc.strerror}") from exc
        if not n:  # None: a non-blocking stdout that took nothing
            raise OSError(errno.EAGAIN, f"writing {what}: it took no bytes")
        view = view[n:]


def run_cat(args: argparse.Namespace) -> int:
    from ._run import run_async

    options = storage_options(args)

    async def go() -> int:
        await write_object(args.uri, options, args.byte_range)
        return 0

    return run_async(go)


def run_rm(args: argparse.Namespace) -> int:
    from ..copy.select import Rules
    from ..providers.base import listing_keeps_damaged
    from ._run import run_async
    from .output import Reporter

    uri = parse_uri(args.uri)
    if args.recursive and uri.scheme == "file" and os.path.realpath(uri.path or ".") == "/":
        # GNU rm's --preserve-root: every file on the machine is never what was meant.
        raise argparse.ArgumentTypeError(f"refusing to delete every file under / "
                                         f"({args.uri!r} is the root directory)")
    if args.recursive and uri.scheme == "file" and os.path.basename(
            args.uri.removeprefix("file://").rstrip("/")) in (".", ".."):
        # GNU rm's refusal too: `rm -r ..` (a typo for `rm -r ../x`) emptied the parent.
        raise argparse.ArgumentTypeError(f"refusing to delete '.' or '..' ({args.uri!r}); "
                                         "name the directory instead")
    # (checked before Rules, which refuses an --include first in its own words)
    if (refused := unmatchable_rule(getattr(args, "rules", None) or [], "URI")) is not None:
        raise argparse.ArgumentTypeError(refused)  # it would delete what it was to keep
    rules = Rules(getattr(args, "rules", None) or [])
    reporter = Reporter("json" if args.json else "quiet" if args.quiet else "text")

    pattern = wildcard(uri) if args.wildcards else None

    async def go() -> int:
        # A damaged object (Redis) is an entry: one the rules leave out is never looked
        # at, one selected fails its delete by name (it failed the whole listing).
        listing_keeps_damaged.set(True)  # (this task only)
        async with get_provider(uri, **storage_options(args)) as provider:
            if pattern is not None:
                targets = [i.path async for i in provider.list(pattern.prefix)
                           if (rel := pattern.relative(i.path)) is not None and rules.wants(rel)]
                if not targets:
                    raise NotFoundError(f"no object matches {redact_text(args.uri)}"
                                        + (" and the --exclude/--include rules" if rules else ""))
                return await _delete_each(provider, uri, targets, args.dryrun, reporter)
            if not args.recursive:
                if not rules.wants(uri.path.rstrip("/").rsplit("/", 1)[-1]):
                    # As cp (and aws s3 rm) of one object take the rules: `rm --exclude
                    # '*.pt' model.pt` deleted the file it was told to keep.
                    raise NotFoundError(f"{redact_text(args.uri)} is left out by the "
                                        "--exclude/--include rules: nothing deleted")
                try:
                    if args.dryrun:
                        await _would_delete(provider, uri.path)  # NotFoundError if absent
                    else:
                        await provider.delete(uri.path)
                except (OSError, ValueError) as exc:
                    # (only for "not there": a refused delete of an object that also
                    # has objects under NAME/ is refused, not a prefix)
                    hint = await _add_r_hint(provider, uri, args.uri) if isinstance(
                        exc, FileNotFoundError) else None
                    err = exc if hint is None else NotFoundError(hint)
                    # --json says so on stdout too, as for each object of rm -r; the
                    # one error line on stderr is main's.
                    reporter.json({"op": "delete", "uri": redact_text(args.uri),
                                   "status": "failed",
                                   "error": redact_text(f"delete {args.uri}: {err}")})
                    if err is exc:
                        raise
                    raise err from None
                reporter.deleted(args.uri, dryrun=args.dryrun)
                return 0
            # (no path: a Redis database's every key, as ls -r lists them; it was "/",
            # which no key starts with, so rm -r said there were no objects)
            base = _under(uri)
            targets = [i.path async for i in provider.list(base)
                       if i.path.startswith(base) and rules.wants(i.path[len(base):])]
            if uri.scheme == "file" and base:
                links = await asyncio.to_thread(_links_under, base)
                targets = sorted(targets + [p for p in links if rules.wants(p[len(base):])])
            if base and not uri.path.endswith("/"):
                # `rm -r NAME` of an object (a file) deletes it too, as GNU rm -r
                # does; only NAME itself, never NAME2 (aws s3 rm's prefix match).
                exact = base[:-1]
                try:
                    await provider.stat(exact)
                except (OSError, ValueError):
                    pass  # no object by that name (a directory, a bare bucket)
                else:
                    if rules.wants(exact.rsplit("/", 1)[-1]):
                        targets.insert(0, exact)
            if not targets:
                raise NotFoundError(f"no objects under {redact_text(args.uri)}"
                                    + (" match the --exclude/--include rules" if rules else ""))
            return await _delete_each(provider, uri, targets, args.dryrun, reporter)

    return run_async(go)


def _links_under(base: str) -> list[str]:
    """The symbolic links under the local directory ``base`` (to files or directories,
    broken ones too), never followed: ``rm -r`` deletes each link itself, never what it
    points to, as GNU ``rm -r`` does. (The provider lists regular files only, so a Hugging
    Face snapshot, all links into ``blobs/``, had nothing deleted, without a word, while
    ``ls`` listed its files.)"""
    from ..copy.keys import is_temp_name

    out = []
    for top, dirs, files in os.walk(base.rstrip("/"), followlinks=False):
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path) and not is_temp_name(name):
                out.append(path)
    return out


def _under(uri: ParsedURI) -> str:
    """The prefix ``rm -r URI`` deletes under: ``NAME/`` for ``NAME`` or ``NAME/``; ``""``
    (everything) for a bucket or a Redis database named bare.

    Only a local path's slashes are collapsed (``d//`` is ``d/`` there). An S3 or Redis
    key's are its own, as ``ls`` and ``aws s3 rm`` take them: ``s3://b//`` is the keys
    starting with ``/`` and ``s3://b/p//`` those under ``p//``, where this deleted the
    whole bucket and everything under ``p/`` while ``ls`` listed nothing there.
    """
    path = uri.path
    if uri.scheme == "file":
        return path.rstrip("/") + "/" if path.strip("/") else ""
    return path if not path or path.endswith("/") else path + "/"


async def _would_delete(provider: Any, path: str) -> None:
    """Raise what ``rm PATH`` would fail with; return if it would delete. A damaged
    object (Redis), which stat cannot make sense of, is deleted: the listing names it."""
    from ..errors import ProtocolError

    try:
        await provider.stat(path)
    except ProtocolError:
        async with contextlib.aclosing(provider.list(path)) as listing:
            async for info in listing:  # (listing_keeps_damaged: it is an entry)
                if info.path == path and "damaged" in info.extra:
                    return
        raise


async def _add_r_hint(provider: Any, uri: ParsedURI, raw: str) -> str | None:
    """What to say when ``rm NAME`` (no ``-r``) found no object NAME but a directory
    or a prefix with objects under it ("no such object (404)" read as if nothing
    were there); None otherwise."""
    if uri.scheme == "file":
        return (f"{uri.path} is a directory; add -r (--recursive) to delete the files in it"
                if os.path.isdir(uri.path) else None)
    return await _prefix_hint(provider, uri, raw,
                              "add -r (--recursive) to delete the objects under it")


async def _prefix_hint(provider: Any, uri: ParsedURI, raw: str, advice: str) -> str | None:
    """``"RAW is a prefix, not an object; ADVICE"`` when there is no object ``uri`` (a
    remote one) but objects under ``uri/``; None otherwise (or when it cannot tell)."""
    capabilities = getattr(provider, "capabilities", None)
    if uri.scheme == "file" or (capabilities is not None and not capabilities.list):
        return None  # a local path, or HTTP: no prefixes to see
    base = _under(uri) or "/"
    try:
        async with contextlib.aclosing(provider.list(base)) as listing:  # the first is enough
            async for info in listing:
                if info.path.startswith(base):
                    return f"{redact_text(raw)} is a prefix, not an object; {advice}"
    except (OSError, ValueError):
        pass  # no listing, or it failed: the command's own error stands
    return None


async def _stat_or_hint(provider: Any, uri: ParsedURI, raw: str) -> ObjectInfo:
    """``provider.stat(uri.path)``; an object that is not there but a prefix with objects
    under it (``stat s3://b/llama``) says so and how to list them, not only "404"."""
    try:
        return await provider.stat(uri.path)  # type: ignore[no-any-return]
    except FileNotFoundError as exc:
        if uri.path.endswith("/"):
            raise  # (its error says a key ending in '/' names a prefix)
        shown = redact_text(raw) + "/"
        hint = await _prefix_hint(provider, uri, raw,
                                  f"'tensorstream ls {shown}' lists the objects under it")
        if hint is None:
            raise
        raise NotFoundError(hint) from exc


async def _delete_each(provider: Any, uri: ParsedURI, targets: list[str], dryrun: bool,
                       reporter: Any) -> int:
    """Delete (or with ``dryrun`` only name) every path; the exit status.

    Up to :data:`_DELETES_IN_FLIGHT` deletes run at once (one after the other, a
    delete's round trips, two for S3, made 10,000 keys take minutes); each is
    reported in the listing's order as it is confirmed. Interrupted, the deletes
    in flight are cancelled: what was printed was deleted.
    """
    from ._run import EXIT_FAILED, EXIT_PARTIAL

    if dryrun:
        for path in targets:
            reporter.deleted(uri.with_path(path), dryrun=True)
        return 0
    failed = 0
    pending: collections.deque[tuple[str, asyncio.Task[None]]] = collections.deque()

    async def report_first() -> None:
        nonlocal failed
        path, task = pending.popleft()
        target = uri.with_path(path)
        try:
            await task
        except (OSError, ValueError) as exc:
            failed += 1
            reporter.deleted(target, dryrun=False, error=f"delete {target}: {exc}")
        else:
            reporter.deleted(target, dryrun=False)

    try:
        for path in targets:
            pending.append((path, asyncio.ensure_future(provider.delete(path))))
            if len(pending) >= _DELETES_IN_FLIGHT:
                await report_first()
        while pending:
            await report_first()
    finally:
        for _, task in pending:  # interrupted, or an error that is not a failed delete
            task.cancel()
        await asyncio.gather(*(task for _, task in pending), return_exceptions=True)
    if not failed:
        return 0
    return EXIT_PARTIAL if failed < len(targets) else EXIT_FAILED


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
        print(redact_text(_escaped_report(report)))
    return 0


def _escaped_report(report: Any) -> str:
    """The report's table with each cell escaped (:func:`.output.escape`): a profile
    name or a config file's path holding terminal escape sequences or a line break (a
    shared config, a profile from SSO) repainted the screen or faked a line of it."""
    import dataclasses

    from ..credentials.report import CredentialReport, ReportLine
    from .output import escape, escape_name

    if not isinstance(report, CredentialReport):  # a third party's: escaped line by line
        return "\n".join(escape(line) for line in str(report).splitlines())
    return str(dataclasses.replace(
        report, uri=escape_name(report.uri),
        lines=tuple(ReportLine(escape(ln.name), escape(ln.shown), escape(ln.source))
                    for ln in report.lines),
        looked_in=tuple(map(escape, report.looked_in)), notes=tuple(map(escape, report.notes))))
