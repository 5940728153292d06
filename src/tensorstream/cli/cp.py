"""``tensorstream cp SRC... DST`` and ``tensorstream sync SRC DST``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..copy.engine import (
    DEFAULT_CONCURRENCY,
    DEFAULT_JOBS,
    DEFAULT_PART_SIZE,
    MAX_PART_SIZE,
    CopyResult,
    copy_async,
    spare_buffers,
)
from ..copy.places import inside, same_store
from ..copy.receive import CHUNK
from ..copy.select import Rules
from ..copy.width import WIDEST
from ..errors import ConfigurationError, TensorstreamError
from ..uri import parse_uri, redact_text
from .metadata_options import add_metadata_options, metadata_options
from .options import (
    Rule,
    add_no_fsync_option,
    add_output_options,
    add_side_options,
    add_storage_options,
    parse_size,
    side_options,
    storage_options,
    unmatchable_rule,
)
from .output import Reporter, human_size
from .progress import make_progress

USAGE = "tensorstream cp [options] SRC [SRC...] DST"
SYNC_USAGE = "tensorstream sync [options] SRC DST"
DESCRIPTION = """\
Copy objects between local disk, HTTP(S), S3 and Redis.

Parts are read concurrently (across objects too) and received straight into
the destination; every copy is verified unless --no-verify: each answer is
pinned to the version the copy started from (If-Match and its ETag; the
source's validators are compared again where an answer named none), a local
file's size is checked before it is published, a remote destination is read
back and compared with checksums taken as the bytes arrived. The destination
appears whole or not at all, also when interrupted (Ctrl-C, SIGTERM, SIGHUP).

With one SRC, DST names the new object, unless DST ends with '/' or is an
existing directory: then the object keeps its name inside DST. With several
SRCs, DST is a directory or prefix. With -r, every object under SRC is
copied to DST/<key relative to SRC> (like 'aws s3 cp --recursive'). A '*'
(any characters, '/' too) or '?' (one character) in an S3 or Redis SRC key
copies every object it matches, named from the last '/' before the first
wildcard, as s5cmd does (quote it from the shell; --raw: take them literally).
Keys that would escape DST ('..', absolute, empty segments) are refused.
Symbolic links in a local SRC are followed (a Hugging Face cache snapshot
copies as the files it shows) unless --no-follow-symlinks; whatever is left
out is reported. '-' as SRC reads stdin, '-' as DST writes to stdout."""

SYNC_DESCRIPTION = """\
Make DST hold every object under SRC: copy what is missing at DST or
differs (size; then ETag when both are S3; then a destination older than its
source, or a local or Redis copy dated otherwise than its source), like
'aws s3 sync'. With --delete, objects under DST that are not under SRC are
deleted too. Same options as cp -r."""

EPILOG = """\
examples:
  # download one object into a directory (keeps its name)
  tensorstream cp s3://models/llama/model.tensors /models/
  # download a whole prefix, only the safetensors
  tensorstream cp 's3://models/llama/*.safetensors' /models/llama/
  tensorstream cp -r --exclude '*' --include '*.safetensors' s3://models/llama/ /models/llama/
  # upload a directory to an S3-compatible store
  tensorstream cp -r --endpoint-url http://minio:9000 ./llama s3://models/llama/
  # a Hugging Face cache snapshot (symlinks into blobs/) to S3
  tensorstream cp -r ~/.cache/huggingface/hub/models--org--name/snapshots/REV/ s3://models/name/
  # between two S3 endpoints
  tensorstream cp -r --src-endpoint-url https://s3.amazonaws.com --dst-endpoint-url \\
      http://minio:9000 s3://public/llama/ s3://models/llama/
  # stage into Redis, then serve from it
  tensorstream cp model.tensors redis://cache:6379/llama/model.tensors
  # interrupted? run the same command with --resume: finished files are skipped,
  # a partial file continues where it stopped
  tensorstream cp -r --resume s3://models/llama/ /models/llama/
  # what would be copied
  tensorstream cp -r --dryrun s3://models/llama/ /models/llama/
  # one JSON object per file, then a summary
  tensorstream cp --json s3://models/a.bin s3://models/b.bin ./

exit status: 0 everything copied (and verified); 1 failed (nothing copied);
2 usage or configuration error; 3 partial: some objects copied, others failed
or were skipped for a problem (broken symlink...); 130/143/129 interrupted by
SIGINT/SIGTERM/SIGHUP (the message says what was kept and how to continue)."""

SYNC_EPILOG = """\
examples:
  tensorstream sync s3://models/llama/ /models/llama/
  tensorstream sync --delete --dryrun ./llama s3://models/llama/
  tensorstream sync --exclude '*.pt' s3://models/llama/ redis://cache:6379/llama/

exit status: as cp (0 done, 1 failed, 2 usage, 3 partial, 130/143/129 interrupted)."""


def part_size(text: str) -> int:
    """``--part-size``: a size (:func:`parse_size`) of at most 5 GiB."""
    n = parse_size(text)
    if n > MAX_PART_SIZE:
        raise argparse.ArgumentTypeError(f"part size must be at most 5GiB, got {text!r}")
    return n


def _add_common(p: argparse.ArgumentParser, *, sync: bool) -> None:
    p.add_argument("paths", nargs="+", metavar="SRC DST" if sync else "SRC... DST",
                   help=argparse.SUPPRESS)
    if not sync:
        p.add_argument("-r", "--recursive", action="store_true",
                       help="copy every object under SRC (directory or prefix)")
    sel = p.add_argument_group("selection")
    sel.add_argument("--exclude", action=Rule, const="exclude", metavar="GLOB",
                     help="leave out keys matching GLOB (relative to SRC; repeatable)")
    sel.add_argument("--include", action=Rule, const="include", metavar="GLOB",
                     help="take back keys an earlier --exclude left out; the last rule that "
                          "matches wins")
    sel.add_argument("--dryrun", action="store_true", help="show what would be done, do nothing")
    sel.add_argument("--no-follow-symlinks", dest="follow_symlinks", action="store_false",
                     help="skip (and report) symbolic links in a local SRC")
    sel.add_argument("--raw", dest="wildcards", action="store_false",
                     help="take '*' and '?' in SRC keys literally (no wildcard matching)")
    if sync:
        sel.add_argument("--delete", action="store_true",
                         help="delete objects under DST that are not under SRC")
    else:
        sel.add_argument("--resume", action="store_true",
                         help="skip objects already complete at DST, and continue an "
                              "interrupted copy to a local destination from the parts already "
                              "written (after checking the source did not change); an "
                              "interrupted --resume copy keeps a hidden partial file for this")
    speed = p.add_argument_group("speed")
    speed.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N",
                       help=f"parts in flight at once (default {DEFAULT_CONCURRENCY}; from HTTP(S)/S3 "
                            "a copy starts at 8 and goes to N when the link is the limit)")
    default_mem = (DEFAULT_CONCURRENCY + spare_buffers(DEFAULT_CONCURRENCY)) * DEFAULT_PART_SIZE
    speed.add_argument("--part-size", type=part_size, default=DEFAULT_PART_SIZE,
                       metavar="SIZE",
                       help=f"bytes per part, e.g. 8M, 64MiB (default {DEFAULT_PART_SIZE >> 20}M, "
                            "at most 5GiB);"
                            f" memory: concurrency x {CHUNK >> 20} MiB to a local destination "
                            f"({DEFAULT_CONCURRENCY * CHUNK >> 20} MiB by default, up to "
                            f"{WIDEST} x that while a slow link has the copy widened), about 1.25 x "
                            "concurrency "
                            f"x part size to S3/Redis ({default_mem >> 20} MiB by default; an S3 "
                            "object over 10,000 parts takes larger parts, fewer at once: at "
                            "most that memory or 2 GiB); S3 to S3, an object uploaded in parts "
                            "no larger is copied in its own parts (its ETag kept)")
    speed.add_argument("--jobs", type=int, default=None, metavar="N",
                       help=f"at most N objects copied at once (default {DEFAULT_JOBS}, and up "
                            f"to {WIDEST} x that while a slow link has the copy widened)")
    speed.add_argument("--no-verify", dest="verify", action="store_false",
                       help="report the copy unverified and skip the checks that cost requests "
                            "or reads (a remote destination's read-back, earlier --resume parts); "
                            "answers stay pinned to one version of the source")
    speed.add_argument("--no-server-side-copy", dest="server_side_copy", action="store_false",
                       help="between two places of one S3 store reached with one key pair, "
                            "copy the bytes through this machine instead of having S3 copy "
                            "each object itself (CopyObject/UploadPartCopy, as aws s3 cp, "
                            "s5cmd and rclone do)")
    add_no_fsync_option(speed, target="a local destination", moment="the copy")
    direct = speed.add_mutually_exclusive_group()
    direct.add_argument("--no-direct", dest="direct", action="store_const", const=False,
                        default=None,
                        help="write a local destination through the page cache (default with "
                             "fsync on: O_DIRECT where its filesystem allows, so the copy costs "
                             "less CPU but is not in the page cache afterwards)")
    direct.add_argument("--direct", dest="direct", action="store_const", const=True,
                        help="O_DIRECT also with --no-fsync (a faster copy; a reader that follows "
                             "at once reads it from the disk)")
    out = add_output_options(
        p, json_help="one JSON object per file on stdout, then a summary object")
    out.add_argument("--only-show-errors", action="store_true",
                     help="print only errors and warnings (skipped entries)")
    add_metadata_options(p)
    add_storage_options(p)
    add_side_options(p)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "cp", parents=[common], usage=USAGE, help="copy objects (local, HTTP(S), S3, Redis)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p, sync=False)
    p.set_defaults(handler=run, sync=False)
    p = sub.add_parser(
        "sync", parents=[common], usage=SYNC_USAGE,
        help="copy only what is missing or differs (optionally --delete the rest)",
        description=SYNC_DESCRIPTION, epilog=SYNC_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p, sync=True)
    p.set_defaults(handler=run, sync=True, recursive=True, resume=False)


def _mode(args: argparse.Namespace) -> str:
    if args.json:
        return "json"
    if args.quiet:
        return "quiet"
    if args.only_show_errors:
        return "errors"
    return "text"


def _interrupted(result: CopyResult, *, sync: bool = False) -> str:
    """What an interrupted copy left behind, and how to continue (``sync`` has no
    ``--resume``: it told its users to add a flag it refuses)."""
    said: list[str] = []
    for o in result.outcomes:
        if o.kept and o.kept_bytes:
            said.append(f"kept {o.kept} ({human_size(o.kept_bytes)} of {human_size(o.size)}) "
                        "to continue from: run the same command with --resume")
        elif o.kept:
            said.append(f"kept {o.kept}, but no part of it was complete yet: a --resume run "
                        f"starts {o.dst} over")
        if o.published:
            said.append(f"{o.dst} was written completely but its verification was "
                        "interrupted: run the copy again to check it")
    copied = sum(1 for o in result.outcomes if o.status == "copied")
    if copied:
        again = "sync skips" if sync else "--resume skips"
        said.append(f"{copied} object(s) were copied completely before that ({again} "
                    "them next time)")
    if not any(o.kept or o.published for o in result.outcomes):
        said.append("no partial object was left behind")
    return "; ".join(said)


def run(args: argparse.Namespace) -> int:
    from ._run import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, print_error, run_async

    name = "sync" if args.sync else "cp"
    if len(args.paths) < 2 or (args.sync and len(args.paths) != 2):
        print_error(f"{name} needs a source and a destination; usage: "
                    + (SYNC_USAGE if args.sync else USAGE))
        return EXIT_USAGE
    for flag, value in (("--concurrency", args.concurrency), ("--jobs", args.jobs)):
        if value is not None and value < 1:
            print_error(f"{flag} must be at least 1 (got {value})")
            return EXIT_USAGE
    *sources, dest = args.paths
    try:
        meta = metadata_options(args)
    except ConfigurationError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    options = storage_options(args)
    src_options, dst_options = side_options(args, "src"), side_options(args, "dst")
    if "-" in args.paths:
        from .stream_copy import copy_stream
        return copy_stream(args, sources, dest, {**options, **src_options},
                           {**options, **dst_options}, meta)
    if (into := _into_special_file(args, sources, dest)) is not None:
        from .stream_copy import copy_into_special
        return copy_into_special(args, sources[0], into, {**options, **src_options})
    # (checked before Rules, which refuses an --include first in its own words)
    if (refused := unmatchable_rule(getattr(args, "rules", None) or [], "SRC")) is not None:
        print_error(refused)  # what it was meant to leave out would be copied
        return EXIT_USAGE
    rules = Rules(getattr(args, "rules", None) or [])
    result = CopyResult()
    mode = _mode(args)
    bars = make_progress(args.progress and mode in ("text", "json"))
    reporter = Reporter(mode, verb="copy", dryrun=args.dryrun, bars=bars)
    if args.sync:
        dest = _as_folder(dest)
    if args.sync and getattr(args, "delete", False) and args.wildcards and (
            refused := _wildcard_source(sources)) is not None:
        # What is "not under SRC" is ill-defined for a pattern: nothing is deleted on a guess.
        print_error(f"--delete with the wildcard source {refused} is refused: name a "
                    "directory or prefix (select with --exclude/--include), or add --raw")
        return EXIT_USAGE
    if args.sync and (refused := _onto_itself(args, sources[0], dest, meta,
                                              {**options, **src_options},
                                              {**options, **dst_options})) is not None:
        # (before --delete's check: the same place is not SRC inside DST, and deletes nothing)
        print_error(refused)  # once: it was a 'same object' error per object, exit 1
        return EXIT_USAGE
    if args.sync and getattr(args, "delete", False) and _source_within(
            sources[0], dest, {**options, **src_options}, {**options, **dst_options}):
        # Every object of SRC is under DST but not "under SRC" as DST's keys go:
        # --delete deleted SRC itself (rclone refuses overlapping remotes too).
        print_error(f"--delete with {redact_text(sources[0])} inside {redact_text(dest)} is "
                    "refused: it would delete the source itself; sync into a directory or "
                    "prefix that does not hold SRC")
        return EXIT_USAGE

    async def go() -> int:
        try:
            await copy_async(
                sources, dest, recursive=args.recursive, concurrency=args.concurrency,
                part_size=args.part_size, verify=args.verify, resume=args.resume,
                durable=args.durable, direct=args.direct, jobs=args.jobs, progress=reporter,
                src_options=src_options,
                dst_options=dst_options, include=rules, skip_unchanged=args.sync,
                dryrun=args.dryrun, follow_symlinks=args.follow_symlinks,
                wildcards=args.wildcards, server_side_copy=args.server_side_copy,
                object_metadata=meta, result=result, **options)
            if args.sync and getattr(args, "delete", False):
                from .sync_delete import delete_extraneous  # (sync --delete's path only)

                await delete_extraneous(args, sources[0], dest, rules, result, reporter,
                                        {**options, **src_options}, {**options, **dst_options})
        finally:
            reporter.close()
        extra = 0
        for line in result.errors:  # errors not tied to one copied object (listing, refusals)
            if line not in reporter.printed_errors:
                extra += 1
                reporter.error(line, [redact_text(s) for s in sources])
        for note in result.notes:
            reporter.warning(note)
        verified = result.verified and args.verify and not args.dryrun
        summary = reporter.summary(seconds=result.seconds, verified=verified,
                                   resumed_bytes=result.resumed_bytes,
                                   server_side_bytes=result.server_side_bytes,
                                   extra_errors=extra)
        if mode == "json":
            reporter.json({"op": "summary", **result.to_dict(), "summary": summary})
        else:
            reporter.print_summary(summary)
        problems = reporter.problems + extra
        done = sum(reporter.counts.get(k, 0) for k in (
            "copied", "unchanged", "dryrun", "delete-deleted", "delete-dryrun"))
        if not problems:
            return EXIT_OK
        return EXIT_PARTIAL if done else EXIT_FAILED

    def interrupted() -> str:
        said = _interrupted(result, sync=args.sync)
        if mode == "json":
            # The lines' reader gets its summary object on an interrupt too (it got
            # none: the last line was an object's, with no sign the command had ended).
            reporter.json({"op": "summary", **result.to_dict(), "interrupted": True,
                           "verified": result.verified and result.files > 0 and args.verify,
                           "summary": f"interrupted; {said}"})
        return said

    return run_async(go, interrupted)


def _as_folder(dest: str) -> str:
    """DST as the folder ``sync`` copies into: a '/' after its path, which in a Redis URI
    comes before the query (``redis://h/b?db=2`` became ``b?db=2/``: "Redis db must be a
    number"). Anywhere else a '?' is part of the name (an S3 key, a file)."""
    if dest.lower().startswith(("redis://", "rediss://")) and "?" in dest:
        path, _, query = dest.partition("?")  # a '?' in a Redis key is written %3F
        return f"{path.rstrip('/')}/?{query}"
    return dest if dest.endswith("/") else dest + "/"


def _into_special_file(args: argparse.Namespace, sources: list[str], dest: str) -> str | None:
    """The local path of DST when one object is copied onto a device, FIFO or socket
    (``cp s3://b/k /dev/null``): written into, like aws s3 cp, never replaced."""
    from ..copy.plan import special_file
    from ..copy.wildcards import wildcard

    if args.sync or args.recursive or len(sources) != 1 or dest.endswith("/"):
        return None
    try:
        uri, src = parse_uri(dest), parse_uri(sources[0])
    except TensorstreamError:
        return None  # said by the copy
    if uri.scheme != "file" or special_file(uri.path) is None:
        return None
    if args.wildcards and wildcard(src) is not None:
        return None  # several objects: refused per object by the copy
    return uri.path


def _source_within(source: str, dest: str, src_options: dict[str, Any],
                   dst_options: dict[str, Any]) -> bool:
    """Whether SRC is DST or lies under it, on the same storage (symlinks resolved, bind
    mounts seen); side options that name no other store (a profile per side) leave it
    there."""
    try:
        src, dst = parse_uri(source), parse_uri(dest)
    except TensorstreamError:
        return False  # said by the copy
    if not same_store(src, dst, src_options, dst_options):
        return False  # one name on two endpoints: two places
    if src.scheme == "file":
        top, below = os.path.realpath(dst.path), os.path.realpath(src.path)
        if os.path.commonpath([top, below]) == top:
            return True
        # DST may hold SRC by another path (a bind mount): told by device and inode
        try:
            # (inside: also a bind mount below DST holding SRC)
            return bool(inside(src.path, dst.path)) or os.path.samefile(src.path, dst.path)
        except OSError:
            return False
    top, below = dst.path.strip("/"), src.path.strip("/")
    return not top or below == top or below.startswith(top + "/")


def _onto_itself(args: argparse.Namespace, source: str, dest: str, meta: Any,
                 src_options: dict[str, Any], dst_options: dict[str, Any]) -> str | None:
    """Why ``sync SRC DST`` with DST the place SRC is (nothing to copy) is refused, or None;
    an S3 prefix whose metadata is changed in place (fields given, ``--copy-props``) runs."""
    if args.wildcards and _wildcard_source([source]) is not None:
        return None  # (each object said by the copy)
    try:
        src, dst = parse_uri(source), parse_uri(dest)
    except TensorstreamError:
        return None  # said by the copy
    if src.scheme != dst.scheme or not same_store(src, dst, src_options, dst_options):
        return None
    if src.scheme == "file":
        try:
            same = os.path.samefile(src.path, dst.path)
        except OSError:
            same = os.path.realpath(src.path) == os.path.realpath(dst.path)
    else:  # (one trailing '/' names the same prefix; 's1//' is another: keys 's1//a')
        same = _prefix(src.path) == _prefix(dst.path)
    if not same:
        return None
    what = f"{redact_text(source)} and {redact_text(dest)} are the same place"
    if dst.scheme != "s3":
        return f"sync is refused: {what} (nothing to copy); sync into another directory or prefix"
    if meta is not None and (meta.overrides() or meta.copy_props != "default"):
        return None  # S3 changes each object in place (refused per object where it cannot)
    return (f"sync is refused: {what} (nothing to copy); to change the objects' metadata in "
            "place, give --content-type, --cache-control or --metadata (--copy-props none "
            "or metadata-directive drops their tags)")


def _prefix(path: str) -> str:
    """A store's path as a prefix: one trailing ``/`` dropped (``b/s1/`` is ``b/s1``),
    never more (``b/s1//`` names the keys ``s1//...``)."""
    return path[:-1] if path.endswith("/") else path


def _wildcard_source(sources: list[str]) -> str | None:
    """The first source that is a wildcard pattern (redacted), if any."""
    from ..copy.wildcards import wildcard

    for source in sources:
        try:
            if wildcard(parse_uri(source)) is not None:
                return redact_text(source)
        except TensorstreamError:
            return redact_text(source)  # a bucket wildcard: refused either way
    return None
