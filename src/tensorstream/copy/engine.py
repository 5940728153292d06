"""The copy engine behind ``tensorstream cp``, usable from Python.

>>> result = tensorstream.copy.engine.copy("s3://bucket/model.tensors", "/models/")  # doctest: +SKIP
>>> result.ok, result.bytes, result.gbps  # doctest: +SKIP

* **Fast**: every object is split into ``part_size`` parts, and at most
  ``concurrency`` parts are in flight across all objects being copied (up to
  ``jobs`` objects at once, so a folder of small objects is as wide as one
  large object); while the link, not the CPU, is the limit the copy widens
  up to four times that, and narrows back when it is not
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
import dataclasses
import logging
import operator
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Protocol

from .. import _loop
from ..api import get_provider
from ..layers.stack import PolicyProvider
from ..providers._http.threads import MAX_THREADS, prestart
from ..providers.base import Pin
from ..uri import ParsedURI, redact_text
from .lane import ThreadSlots, run_lane, takes
from .local import Listings, copy_to_local
from .places import connection
from .plan import Job, Planner
from .receive import CHUNK
from .remote import copy_to_writer
from .select import FileOutcome, Rules, notify
from .server_side import copy_on_server
from .server_side import takes as takes_on_server
from .sinks import BufferPool, PartBuffer, pool_count
from .tasks import cancel_and_wait, gather_or_cancel
from .width import START, WIDEST, Width, descriptor_room

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
#: The largest part: S3's largest, and a part is one buffer in memory for S3
#: and Redis destinations (a part size past the address space failed inside
#: mmap with "Python int too large to convert to C ssize_t").
MAX_PART_SIZE = 5 << 30
#: The largest object stored in one piece that one S3 ``CopyObject`` copies (S3's limit).
COPY_CUTOFF = 5 << 30

class ProgressListener(Protocol):
    """Receives progress events (the CLI's tqdm bars implement this).

    Optional methods, called when the listener has them: ``phase(name,
    "verifying")`` when a destination is being read back (then
    ``verified(name, nbytes)`` as it is), and ``file_done(outcome)`` with the
    :class:`FileOutcome` of every object, copied, failed, skipped or
    interrupted. ``advance`` may be called from worker threads, at any time;
    the other methods may be called from worker threads too (objects copied
    by the lane, :mod:`tensorstream.copy.lane`), but never two at once.
    """

    def start(self, files: int, total_bytes: int) -> None: ...
    def file_started(self, name: str, size: int) -> None: ...
    def advance(self, name: str, nbytes: int) -> None: ...
    def file_finished(self, name: str, ok: bool) -> None: ...


@dataclasses.dataclass
class CopyResult:
    """Summary of a copy. ``ok`` is False when any object failed or was refused."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    verified: bool = True
    resumed_bytes: int = 0
    #: Bytes of ``bytes`` that S3 copied itself (server-side): none crossed this machine.
    server_side_bytes: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    #: Things the user should know that are neither errors nor skips.
    notes: list[str] = dataclasses.field(default_factory=list)
    #: One entry per object considered, in the order they finished.
    outcomes: list[FileOutcome] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def gbps(self) -> float:
        """Throughput in GB/s (10^9 bytes per second) of the bytes transferred through
        this machine (not those kept from an earlier run, nor those S3 copied itself)."""
        moved = self.bytes - self.resumed_bytes - self.server_side_bytes
        return moved / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "gbps": round(self.gbps, 6),
            "verified": self.verified,
            "resumed_bytes": self.resumed_bytes,
            "server_side_bytes": self.server_side_bytes,
            "errors": list(self.errors),
            "skipped": list(self.skipped),
        }


class _Copier(Planner):
    def __init__(self, *, concurrency: int, part_size: int, verify: bool, resume: bool,
                 jobs: int, progress: ProgressListener | None, options: dict[str, Any],
                 src_options: dict[str, Any] | None = None,
                 dst_options: dict[str, Any] | None = None, rules: Rules | None = None,
                 skip_unchanged: bool = False, dryrun: bool = False,
                 follow_symlinks: bool = True, result: CopyResult | None = None,
                 durable: bool = True, direct: bool | None = None,
                 wildcards: bool = True, server_side_copy: bool = True,
                 copy_cutoff: int = COPY_CUTOFF, object_metadata: Any = None) -> None:
        concurrency, part_size, jobs = (_whole(n, v) for n, v in (
            ("concurrency", concurrency), ("part_size", part_size), ("jobs", jobs)))
        if concurrency < 1 or part_size < 1 or jobs < 1:
            raise ValueError("concurrency, part_size and jobs must be >= 1")
        if part_size > MAX_PART_SIZE:
            raise ValueError(f"part_size must be at most {MAX_PART_SIZE} bytes (5 GiB), "
                             f"got {part_size}")
        self.concurrency = concurrency
        self.part_size = part_size
        self.verify = verify
        self.resume = resume
        self.durable = durable
        #: O_DIRECT for local destinations: by default only for durable ones.
        self.direct = durable if direct is None else direct
        self.jobs = jobs
        self.progress = progress
        self.options = dict(options)
        self.options.setdefault("concurrency", concurrency)
        self.side_options = {"src": dict(src_options or {}), "dst": dict(dst_options or {})}
        self.rules = rules or Rules()
        self.skip_unchanged = skip_unchanged
        self.dryrun = dryrun
        self.follow_symlinks = follow_symlinks
        self.wildcards = wildcards
        #: Copies within one S3 store made by S3 itself (:mod:`.server_side`), until the
        #: server says it cannot; objects stored in one piece above the cutoff go in parts.
        self.server_side_copy = server_side_copy
        #: The ways of copying (``CopyObject``, ``UploadPartCopy``; ``"all"``) the
        #: destination's store answered ``501 NotImplemented`` to: streamed for the run.
        self.server_copy_lacks: set[str] = set()
        #: What S3 stores with each object (a MetadataOptions: :mod:`.metadata`).
        self.object_metadata = object_metadata
        self.copy_cutoff = _whole("copy_cutoff", copy_cutoff)
        if not 0 <= self.copy_cutoff <= COPY_CUTOFF:
            raise ValueError(f"copy_cutoff must be 0 to {COPY_CUTOFF} bytes (5 GiB, S3's "
                             f"largest CopyObject), got {copy_cutoff}")
        # Reads in flight are capped at ``concurrency``; a few spare buffers let
        # new reads start while finished parts are still being written. The
        # copy remakes both slots when it starts, once its sources are known
        # (parts from a receiving source start START wide: see the width).
        self.read_slots = asyncio.Semaphore(concurrency)
        self.job_slots = asyncio.Semaphore(jobs)
        #: Objects whose parts are larger than part_size (S3's 10,000 parts) go one at a
        #: time: each one's buffers are bounded (:func:`.sinks.pool_count`), not their sum.
        self.large_parts = asyncio.Semaphore(1)
        self.pool = BufferPool(concurrency + spare_buffers(concurrency), part_size)
        #: Pools of other part sizes (S3 objects over 10,000 parts of ``part_size``),
        #: shared while an object uses one and released after: kept, each held its
        #: buffers (40 x 10 MiB for a 100 GiB object) to the end of the copy.
        self._pools: weakref.WeakValueDictionary[int, BufferPool] = weakref.WeakValueDictionary(
            {part_size: self.pool})
        self.width: Width | None = None  # while run() runs
        #: The widest the open-file limit allows (:func:`.width.descriptor_room`), once run.
        self._most: int | None = None
        self.lane_objects = ThreadSlots(jobs)
        self.lane_reads = ThreadSlots(concurrency)
        self.providers: dict[tuple[str, tuple[Any, ...]], PolicyProvider] = {}
        self.listings = Listings()
        self.stores: dict[tuple[tuple[Any, ...], tuple[Any, ...]], bool] = {}
        self.result = result if result is not None else CopyResult()
        #: Held while the result or the progress listener is told of an object:
        #: lane threads end objects beside the event loop.
        self.events = threading.RLock()

    # -- providers -----------------------------------------------------------
    def provider(self, uri: ParsedURI, side: str = "src") -> PolicyProvider:
        """One provider per (side, location): each side may have its own endpoint/credentials."""
        extra = self.side_options[side]
        key = (side if extra else "", connection(uri))
        if key not in self.providers:
            self.providers[key] = get_provider(uri, **{**self.options, **extra})
        return self.providers[key]

    def pool_for(self, part_size: int) -> BufferPool:
        """The part buffers for parts of ``part_size`` (a destination may need
        larger parts than asked: S3 takes at most 10,000 per object; fewer of those:
        :func:`.sinks.pool_count`)."""
        pool = self._pools.get(part_size)
        if pool is None:
            count = pool_count(self.concurrency + spare_buffers(self.concurrency), part_size,
                               self.part_size)
            pool = self._pools[part_size] = BufferPool(count, part_size)
        return pool

    def outcome(self, outcome: FileOutcome) -> None:
        with self.events:  # lane threads record outcomes too
            self.result.outcomes.append(outcome)
            notify(self.progress, "file_done", outcome)

    async def close(self) -> None:
        for p in self.providers.values():
            try:
                await p.close()
            except Exception:  # closing must not hide the real outcome
                pass

    def error(self, what: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
        self.result.errors.append(redact_text(f"{what}: {text}"))

    # -- execution -----------------------------------------------------------
    async def run(self, jobs: list[Job]) -> None:
        if self.dryrun:
            for job in jobs:
                self.outcome(FileOutcome(job.label, job.dst_label, job.info.size, "dryrun"))
            return
        if self.progress:
            self.progress.start(len(jobs), sum(j.info.size for j in jobs))
        # Within the open-file limit: every part and object in flight holds descriptors.
        self._most = descriptor_room()
        if self._most is not None:
            self.concurrency = min(self.concurrency, self._most)
            self.jobs = min(self.jobs, self._most)
        self.job_slots = asyncio.Semaphore(self.jobs)
        # Parts start START wide; the width gives the rest of concurrency when
        # the receiving thread finds the link is the limit. Sources it does not
        # receive (local files, Redis) could only widen by the idle-machine
        # rule, so they start at concurrency as before.
        self._start = self.concurrency
        if all(j.src.capabilities.range_streams for j in jobs):
            self._start = min(self.concurrency, START)
        self.read_slots = asyncio.Semaphore(self._start)
        # Objects of one part run start to end on lane threads (:mod:`.lane`),
        # within slots of their own that the width moves with the others.
        lane_jobs = [j for j in jobs if takes(self, j)]
        taken = {id(j) for j in lane_jobs}
        others = [j for j in jobs if id(j) not in taken]
        self.lane_objects = ThreadSlots(self.jobs)
        self.lane_reads = ThreadSlots(self._start)
        # As many threads as the widest copy has objects in flight, leaving
        # the data plane threads for the other objects' parts.
        widest = self.jobs + max(0, min(WIDEST * self.concurrency, MAX_THREADS)
                                 - self.concurrency)
        threads = min(widest, MAX_THREADS - _KEEP_THREADS)

        async def one(job: Job) -> None:
            async with self.job_slots:
                await self.copy_one(job)

        follow = asyncio.create_task(self._follow_the_link())
        try:
            await asyncio.gather(run_lane(self, lane_jobs, self.lane_objects, self.lane_reads,
                                          threads),
                                 *(one(j) for j in others))
        finally:
            await cancel_and_wait([follow])

    async def _follow_the_link(self) -> None:
        """Widen while the link, not the CPU, is the limit, and narrow back when
        it is not (:class:`~tensorstream.copy.width.Width`: up to ``WIDEST x
        concurrency`` parts and objects in flight)."""
        self.width = Width([self.job_slots, self.read_slots, self.lane_objects, self.lane_reads],
                           self.concurrency,
                           start=([self.read_slots, self.lane_reads], self._start),
                           most=self._most)
        await self.width.follow()

    def begin(self, job: Job) -> tuple[FileOutcome, float]:
        """An object's copy starts (on the loop or a lane thread): its outcome,
        failed until it has ended well, and when it started."""
        if self.progress:
            with self.events:
                self.progress.file_started(job.label, job.info.size)
        return FileOutcome(job.label, job.dst_label, job.info.size, "failed"), time.perf_counter()

    def _one_version(self, job: Job) -> bool:
        """Whether the copy's bytes are known to come from one version of the source.

        A source that names no version (no ETag, no Last-Modified: a Redis string, an
        HTTP server sending neither) read in several requests could be replaced with
        as many bytes between them, and the copy would mix the two unseen: the size,
        all there is to compare after the copy, stays the same. Such a copy is not
        reported verified, and a note says why. (Called with ``self.events`` held.)
        """
        if job.source_checked or job.info.size == 0 or Pin.of(job.info).validated:
            return True
        # One request (one answer, one version): a part of an HTTP(S)/S3 stream,
        # or one chunk of a provider read chunk by chunk.
        one_read = self.part_size if job.src.capabilities.range_streams else CHUNK
        if job.info.size <= one_read:
            return True
        self.result.notes.append(
            f"{job.label} names no version (no ETag or Last-Modified), so a change between "
            "its reads could not be seen: the copy is not reported verified")
        return False

    def ended(self, job: Job, out: FileOutcome, t0: float, exc: BaseException | None, *,
              resumed: int = 0, interrupted: bool = False) -> None:
        """Record how an object's copy ended: ``exc`` None when copied;
        ``interrupted`` (or an ``exc`` that is not an ``Exception``) when the
        copy was cancelled or stopped; otherwise failed with ``exc``."""
        ok = exc is None
        with self.events:
            if ok:
                self.result.files += 1
                self.result.bytes += job.info.size
                self.result.resumed_bytes += resumed
                # "Verified" means compared with the source's bytes or a checksum
                # the source stored. Parts kept from an earlier run were only
                # compared with that run's journal (a file anyone can edit), so
                # they are not.
                verified = self.verify and (resumed == 0 or job.source_checked) and (
                    self._one_version(job))
                if job.server_side:  # compared by what S3 says of the copy, or not at all
                    verified = job.checked_by is not None
                    self.result.server_side_bytes += job.info.size
                    out.server_side, out.verified_by = True, job.checked_by
                if not verified:
                    self.result.verified = False
                out.status, out.resumed_bytes, out.verified = "copied", resumed, verified
            elif interrupted or not isinstance(exc, Exception):
                out.status = "interrupted"
            else:
                assert exc is not None
                self.error(f"{job.label} -> {job.dst_label}", exc)
                out.error = self.result.errors[-1]
            out.published = job.published and not ok
            if job.kept is not None:
                out.kept, out.kept_bytes = job.kept
            out.seconds = time.perf_counter() - t0
            if self.progress:
                self.progress.file_finished(job.label, ok)
            self.outcome(out)

    async def copy_one(self, job: Job) -> None:
        out, t0 = self.begin(job)
        try:
            if job.local is not None:
                resumed = await copy_to_local(self, job)
            elif takes_on_server(self, job) and await copy_on_server(self, job):
                resumed = 0
            else:
                resumed = await copy_to_writer(self, job)
        except Exception as exc:  # one object's failure is reported, not fatal
            self.ended(job, out, t0, exc)
        except BaseException as exc:
            self.ended(job, out, t0, exc)
            raise
        else:
            self.ended(job, out, t0, None, resumed=resumed)

    async def _run_parts(self, todo: Iterable[int],
                         run: Callable[[int], Coroutine[Any, Any, None]]) -> None:
        """``run(index)`` for every part, within the copy's read slots across
        every object being copied and at most ``concurrency`` of this object at
        once; tasks are made only as slots free up."""
        pending: set[asyncio.Task[None]] = set()
        release = lambda _task: self.read_slots.release()  # noqa: E731

        try:
            for index in todo:
                while len(pending) >= self.concurrency:
                    # The copy's extra width is for more objects, not more parts
                    # of one: one object that wide downloads sooner but leaves
                    # all of its writeback to the end, and a durable copy of it
                    # measured slower (docs/benchmarks.md, "cp: a width that
                    # follows the link").
                    done, pending = await asyncio.wait(
                        pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        t.result()
                await self.read_slots.acquire()
                try:
                    task = asyncio.create_task(run(index))
                except BaseException:
                    self.read_slots.release()
                    raise
                # Released when the task ends, even if cancelled before it ran.
                task.add_done_callback(release)
                pending.add(task)
                for t in [t for t in pending if t.done()]:
                    pending.discard(t)
                    t.result()  # the first failure stops this object
            while pending:
                done, pending = await asyncio.wait(pending,
                                                   return_when=asyncio.FIRST_EXCEPTION)
                for t in done:
                    t.result()
        finally:
            await cancel_and_wait(pending)

    async def _check_source_unchanged(self, job: Job) -> None:
        """Compare the source's validators after the copy with those it was read
        under: ETag (which every read was also pinned to), size and mtime."""
        await job.src.stat_pinned(job.src_path, Pin.of(job.info))

    async def _each_part(self, todo: Iterable[int], parts: Sequence[tuple[int, int]],
                         fn: Callable[[int, PartBuffer, int], Any]) -> None:
        """Run ``fn(index, buffer, length)`` for parts concurrently, with pool buffers."""
        sem = asyncio.Semaphore(self.concurrency)

        async def one(index: int) -> None:
            async with sem:
                buf = await self.pool.get()
                start, end = parts[index]
                await fn(index, buf, end - start)

        await gather_or_cancel(one(i) for i in todo)

def _whole(name: str, value: Any) -> int:
    """``value`` as an int (numpy's too); a float, bool or string is refused by name: a
    part size of 1.5 failed each object with "'float' object cannot be interpreted as an
    integer", and 1.5 jobs were taken as they came."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None


#: Data plane threads the lane leaves to the copy's other objects.
_KEEP_THREADS = 16


def spare_buffers(concurrency: int) -> int:
    """Part buffers beyond ``concurrency``: memory is (concurrency + spare) x part size."""
    return max(1, concurrency // 4)


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
    jobs: int = DEFAULT_JOBS,
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
    that one ``CopyObject`` copies (default and most: 5 GiB). Pass
    ``result`` to have it filled in place, so a caller still
    sees what happened when the copy is cancelled. ``object_metadata``
    (:class:`~tensorstream.providers.s3.metadata.MetadataOptions`): what an S3
    destination stores with each object (default: an S3 source's Content-Type and
    user metadata, else the Content-Type guessed from the name, as ``aws s3 cp``).

    A local destination is on the disk (fsync) before it appears unless
    ``durable=False``; a durable one is written with ``O_DIRECT`` where its
    filesystem allows, so it is not left in the page cache (``direct=False``:
    through the page cache, for a reader that follows at once;
    ``direct=True`` also for ``durable=False``).
    """
    srcs = [sources] if isinstance(sources, str) else list(sources)
    if object_metadata is not None:
        from ..uri import parse_uri
        from .metadata import check_destination

        check_destination(object_metadata, parse_uri(destination).scheme)
    copier = _Copier(concurrency=concurrency, part_size=part_size, verify=verify,
                     resume=resume, jobs=jobs, progress=progress, options=options,
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
