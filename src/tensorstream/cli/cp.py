"""``tensorstream cp SRC... DST``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..copy.engine import (
    DEFAULT_CONCURRENCY,
    DEFAULT_JOBS,
    DEFAULT_PART_SIZE,
    copy_async,
    spare_buffers,
)
from ..uri import redact_text
from .options import add_storage_options, parse_size, storage_options
from .progress import make_progress

USAGE = "tensorstream cp [options] SRC [SRC...] DST"
DESCRIPTION = """\
Copy objects between local disk, HTTP(S), S3 and Redis.

Parts are read concurrently (across objects too) and received straight into
the destination; every copy is verified unless --no-verify: each answer is
pinned to the version the copy started from (If-Match and its ETag; the
source's validators are compared again where an answer named none), a local
file's size is checked before it is published, a remote destination is read
back and compared with checksums taken as the bytes arrived. The destination
appears whole or not at all, also when interrupted (Ctrl-C, SIGTERM).

With one SRC, DST names the new object, unless DST ends with '/' or is an
existing directory: then the object keeps its name inside DST. With several
SRCs, DST is a directory or prefix. With -r, every object under SRC is
copied to DST/<key relative to SRC> (like 'aws s3 cp --recursive'); keys
that would escape DST ('..', absolute, empty segments) are refused."""

EPILOG = """\
examples:
  # download one object into a directory (keeps its name)
  tensorstream cp s3://models/llama/model.tensors /models/
  # download a whole prefix
  tensorstream cp -r s3://models/llama/ /models/llama/
  # upload a directory to an S3-compatible store
  tensorstream cp -r --s3-endpoint http://minio:9000 ./llama s3://models/llama/
  # stage into Redis, then serve from it
  tensorstream cp model.tensors redis://cache:6379/llama/model.tensors
  # a big download that may be interrupted: run again with --resume to continue
  tensorstream cp --resume https://host/model.tensors ./model.tensors
  # machine-readable summary
  tensorstream cp --json --quiet s3://models/a.bin s3://models/b.bin ./

exit status: 0 all copied and verified, 1 something failed or was refused,
2 usage error, 130/143 interrupted (nothing partial left behind)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "cp", parents=[common], usage=USAGE, help="copy objects (local, HTTP(S), S3, Redis)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="SRC... DST", help=argparse.SUPPRESS)
    p.add_argument("-r", "--recursive", action="store_true",
                   help="copy every object under SRC (directory or prefix)")
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N",
                   help=f"parts in flight at once (default {DEFAULT_CONCURRENCY})")
    default_mem = (DEFAULT_CONCURRENCY + spare_buffers(DEFAULT_CONCURRENCY)) * DEFAULT_PART_SIZE
    p.add_argument("--part-size", type=parse_size, default=DEFAULT_PART_SIZE, metavar="SIZE",
                   help=f"bytes per part, e.g. 8M, 64MiB (default {DEFAULT_PART_SIZE >> 20}M); "
                        "memory: concurrency x 1 MiB to a local destination "
                        f"({DEFAULT_CONCURRENCY} MiB by default), about 1.25 x concurrency "
                        f"x part size to S3/Redis ({default_mem >> 20} MiB by default)")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS, metavar="N",
                   help=f"objects copied at once (default {DEFAULT_JOBS})")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="report the copy unverified and skip the checks that cost requests or "
                        "reads (a remote destination's read-back, earlier --resume parts); "
                        "answers stay pinned to one version of the source")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted copy to a local destination from the parts "
                        "already written (after checking the source did not change); an "
                        "interrupted --resume copy keeps a hidden partial file for this")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary (files, bytes, seconds, gbps, verified, errors)")
    add_storage_options(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ._run import EXIT_USAGE, print_error, run_async

    if len(args.paths) < 2:
        print_error("cp needs a source and a destination; usage: " + USAGE)
        return EXIT_USAGE
    if args.concurrency < 1 or args.jobs < 1:
        print_error("--concurrency and --jobs must be at least 1")
        return EXIT_USAGE
    *sources, dest = args.paths
    options = storage_options(args)
    progress = make_progress(args.quiet)

    async def go() -> int:
        try:
            result = await copy_async(
                sources, dest, recursive=args.recursive, concurrency=args.concurrency,
                part_size=args.part_size, verify=args.verify, resume=args.resume,
                jobs=args.jobs, progress=progress, **options)
        finally:
            if progress is not None:
                progress.close()
        for line in result.errors:
            print_error(line)
        if not args.quiet:
            for line in result.skipped:
                print(f"tensorstream: skipped {redact_text(line)}", file=sys.stderr)
        if args.json:
            print(json.dumps(result.to_dict(), sort_keys=True))
        elif not args.quiet:
            done = f"copied {result.files} file(s), {result.bytes} bytes in {result.seconds:.2f}s"
            rate = f" ({result.gbps:.3f} GB/s)" if result.seconds > 0 else ""
            check = ", verified" if result.verified else ""
            print(done + rate + check, file=sys.stderr)
        return 0 if result.ok else 1

    return run_async(go)
