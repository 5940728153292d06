"""The copy engine behind ``tensorstream cp``, usable from Python.

>>> result = tensorstream.copy.engine.copy("s3://bucket/model.tensors", "/models/")  # doctest: +SKIP
>>> result.ok, result.bytes, result.gbps  # doctest: +SKIP

* **Fast**: every object is split into ``part_size`` parts, and at most
  ``concurrency`` parts are in flight across all objects being copied (up to
  ``jobs`` objects at once, so a folder of small objects is as wide as one
  large object); while the link, not the CPU, is the limit the copy widens
  up to four times that (objects too when no ``jobs`` is given: a number
  given is the most objects at once), and narrows back when it is not
  (:mod:`tensorstream.copy.width`). Parts are fetched on the data plane's worker threads
  (:mod:`tensorstream.copy.receive`); objects of one part from HTTP(S) or S3
  into local files are each run start to end by one of those threads, with
  no event-loop hop per object (:mod:`tensorstream.copy.lane`). A local destination
  (:mod:`tensorstream.copy.local`) receives each part straight into its
  temp file: the bytes go from the socket through a 1 MiB chunk buffer into
  the file (``pwrite``), with writeback started as each part completes so
  the one fsync at the end is short; memory is 1 MiB per part in flight
  whatever the part size. S3 and Redis (:mod:`tensorstream.copy.remote`)
  get each part as soon as it is in, in any order, from a pool of
  ``concurrency + spare`` part buffers (memory ``(concurrency + spare) x
  part_size``); other writers get the parts in order.
* **Verified** (honestly): every ranged answer is checked by the data plane
  (exact ``Content-Range``, length, no content coding) and pinned to the
  version the copy started from (``If-Match`` and the answer's ``ETag``);
  where an answer did not name its version, the source's validators (ETag,
  size, Last-Modified) are compared again after the copy. A local temp file
  is ours alone (``O_EXCL``, 0600, locked, held open), so it is not read
  back: its size is compared with the source's before it is published.
  Parts from an earlier ``--resume`` run are read back and compared with the
  journal's sha256. S3 and Redis vouch for what they stored before anything
  is published (S3: the Content-MD5 of the source's bytes and the ETags it
  answers; Redis: each chunk read back in the ``MULTI`` that stages it). Any
  other writer's destination is read back after commit and compared with
  the sha256 of every part taken as it arrived; a mismatch removes it.
* **Atomic and resumable**: destinations appear whole or not at all; with
  ``resume=True`` an interrupted local copy keeps its hidden temp file and a
  journal, and the next ``resume=True`` run fetches only the missing parts
  after checking the source's size and ETag.
* **Safe**: keys from listings go through :mod:`tensorstream.copy.keys`; nothing
  is written outside the destination and symlinks in it are not followed.

Only the public provider API is used, so any registered backend works.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .. import _loop
from ..providers._http.threads import prestart
from .copier import COPY_CUTOFF, MAX_PART_SIZE
from .copier import _Copier as _Copier  # (its old home: tests name it here)
from .copier import spare_buffers as spare_buffers  # (its old home: tests name it here)
from .result import CopyResult, ProgressListener
from .select import FileOutcome, Rules

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_JOBS",
    "DEFAULT_PART_SIZE",
    "MAX_PART_SIZE",
    "CopyResult",
    "FileOutcome",
    "ProgressListener",
    "copy",
    "copy_async",
    "copy_tree",
]

log = logging.getLogger("tensorstream.copy")

MiB = 1 << 20
DEFAULT_PART_SIZE = 8 * MiB
DEFAULT_CONCURRENCY = 32
#: Objects at once. An object of one part hands its read slot back when its
#: bytes are in, so with more jobs than ``concurrency`` it is made durable
#: (fsync, rename, the directory's fsync) while the next object's read runs;
#: twice ``concurrency`` measured slower here with fsync on (100 x 4 MiB,
#: whole process, paired: 1.44 -> 1.81 s loopback, 1.85 -> 2.01 s paced, load
#: 13-15; the harness: 0.71-0.88x the earlier main in all four durable folder
#: runs): more concurrent fsyncs and threads, not more reads.
DEFAULT_JOBS = DEFAULT_CONCURRENCY


async def copy_async(
    sources: str | list[str],
    destination: str,
    *,
    recursive: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    part_size: int = DEFAULT_PART_SIZE,
    verify: bool = True,
    resume: bool = False,
    durable: bool = True,
    direct: bool | None = None,
    jobs: int | None = None,
    progress: ProgressListener | None = None,
    src_options: dict[str, Any] | None = None,
    dst_options: dict[str, Any] | None = None,
    include: Rules | None = None,
    skip_unchanged: bool = False,
    dryrun: bool = False,
    follow_symlinks: bool = True,
    wildcards: bool = True,
    server_side_copy: bool = True,
    copy_cutoff: int = COPY_CUTOFF,
    object_metadata: Any = None,
    result: CopyResult | None = None,
    **options: Any,
) -> CopyResult:
    """Copy ``sources`` to ``destination`` (see the module docstring).

    One source and a destination not ending in ``/`` (and not an existing
    directory) names the object itself; otherwise each object lands under
    the destination by its name (``recursive``: by its key relative to the
    source prefix, like ``aws s3 cp --recursive``). ``options`` are storage
    options (``s3_endpoint=...``) passed to :func:`tensorstream.get_provider`.
    Failures of single objects are collected in :attr:`CopyResult.errors`.
    ``jobs``: at most that many objects at once (default :data:`DEFAULT_JOBS`,
    widened with the link up to four times that).
    ``verify=False`` is ``cp --no-verify`` (docs/cli.md, "Verification").
    ``progress`` (:class:`~tensorstream.copy.result.ProgressListener`) is
    told of each object and of its bytes as they land (the CLI's bars).

    ``src_options``/``dst_options`` add to ``options`` for one side only
    (two S3 endpoints). ``include`` (:class:`~tensorstream.copy.select.Rules`)
    selects keys by glob. ``skip_unchanged`` (also implied by ``resume``)
    leaves out objects whose destination already holds them (size, ETag,
    modification time, like ``aws s3 sync``). ``dryrun`` plans and reports
    without copying. Local source directories have their symbolic links
    followed unless ``follow_symlinks=False`` (then they are reported as
    skipped). A ``*`` or ``?`` in the key of a source that can be listed (S3,
    Redis) makes it a pattern, as in s5cmd (:mod:`tensorstream.copy.wildcards`):
    every matching object is copied, named from the last ``/`` before the
    first wildcard; ``wildcards=False`` takes such keys literally. Between two places
    of one S3 store reached with one key pair, S3 copies each object itself
    (:mod:`tensorstream.copy.server_side`; ``server_side_copy=False``: the bytes go
    through this machine); ``copy_cutoff`` is the largest object stored in one piece
    that one ``CopyObject`` copies (default and most: 5 GiB). Streamed from S3 into S3,
    an object uploaded in parts of at most ``part_size`` is written in its own parts
    (:mod:`tensorstream.copy.source_layout`), so that the copy's ETag is the source's. Pass
    ``result`` to have it filled in place, so a caller still
    sees what happened when the copy is cancelled. ``object_metadata``
    (:class:`~tensorstream.providers.s3.metadata.MetadataOptions`): what an S3
    destination stores with each object (default: an S3 source's Content-Type and
    user metadata, else the Content-Type guessed from the name, as ``aws s3 cp``);
    its ``copy_props`` (``--copy-props``) chooses what an S3 -> S3 copy carries from its
    source: its fields and tags, its fields only, or nothing (refused where a side is not
    S3).

    A local destination is on the disk (fsync) before it appears unless
    ``durable=False``; a durable one is written with ``O_DIRECT`` where its
    filesystem allows, so it is not left in the page cache (``direct=False``:
    through the page cache, for a reader that follows at once;
    ``direct=True`` also for ``durable=False``).
    """
    srcs = [sources] if isinstance(sources, str) else list(sources)
    if object_metadata is not None:
        from ..uri import parse_uri
        from .metadata import check_copy_props, check_destination

        check_destination(object_metadata, parse_uri(destination).scheme)
        check_copy_props(object_metadata, [parse_uri(s).scheme for s in srcs],
                         parse_uri(destination).scheme)
    copier = _Copier(concurrency=concurrency, part_size=part_size, verify=verify,
                     resume=resume, jobs=DEFAULT_JOBS if jobs is None else jobs,
                     jobs_widen=jobs is None, progress=progress, options=options,
                     src_options=src_options, dst_options=dst_options, rules=include,
                     skip_unchanged=skip_unchanged or resume, dryrun=dryrun,
                     follow_symlinks=follow_symlinks, result=result, durable=durable,
                     direct=direct, wildcards=wildcards,
                     server_side_copy=server_side_copy, copy_cutoff=copy_cutoff,
                     object_metadata=object_metadata)
    t0 = time.perf_counter()
    if not dryrun:
        # The part threads start while the sources are listed, not one by one
        # on the event loop when the first parts are sent.
        prestart(concurrency)
    try:
        plan = await copier.plan(srcs, destination, recursive)
        await copier.run(plan)
    finally:
        copier.result.seconds = time.perf_counter() - t0
        await asyncio.shield(copier.close())
    if copier.result.files == 0:
        copier.result.verified = False
    return copier.result


def copy(sources: str | list[str], destination: str, **options: Any) -> CopyResult:
    """Synchronous :func:`copy_async` (runs on tensorstream's I/O loop)."""
    return _loop.run_sync(copy_async(sources, destination, **options))


def copy_tree(source: str, destination: str, **options: Any) -> CopyResult:
    """``copy(source, destination, recursive=True)``: a directory or prefix."""
    return copy(source, destination, recursive=True, **options)
