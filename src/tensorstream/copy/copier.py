"""The state of one copy and each object's way through it (:class:`_Copier`): its
providers, slots, part buffers and width, how an object is copied (to a local file,
by S3 itself, or to a writer) and how its end is recorded. The front door is
:func:`tensorstream.copy.engine.copy_async`; planning is :mod:`.plan`'s."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from ..api import get_provider
from ..layers.stack import PolicyProvider
from ..providers._http.threads import MAX_THREADS
from ..providers.base import Pin
from ..uri import ParsedURI, redact_text
from .job import Job
from .lane import ThreadSlots, run_lane, takes
from .local import Listings, copy_to_local
from .places import connection
from .plan import Planner
from .receive import CHUNK
from .remote import copy_to_writer
from .result import CopyResult, ProgressListener
from .select import FileOutcome, Rules, notify
from .server_side import copy_on_server
from .server_side import takes as takes_on_server
from .sinks import BufferPool, PartBuffer, pool_count
from .tasks import cancel_and_wait, gather_or_cancel
from .width import START, WIDEST, Width, descriptor_room

__all__ = ["COPY_CUTOFF", "MAX_PART_SIZE", "spare_buffers"]

#: The largest part: S3's largest, and a part is one buffer in memory for S3
#: and Redis destinations (a part size past the address space failed inside
#: mmap with "Python int too large to convert to C ssize_t").
MAX_PART_SIZE = 5 << 30
#: The largest object stored in one piece that one S3 ``CopyObject`` copies (S3's limit).
COPY_CUTOFF = 5 << 30


class _Copier(Planner):
    def __init__(self, *, concurrency: int, part_size: int, verify: bool, resume: bool,
                 jobs: int, progress: ProgressListener | None, options: dict[str, Any],
                 src_options: dict[str, Any] | None = None,
                 dst_options: dict[str, Any] | None = None, rules: Rules | None = None,
                 skip_unchanged: bool = False, dryrun: bool = False,
                 follow_symlinks: bool = True, result: CopyResult | None = None,
                 durable: bool = True, direct: bool | None = None,
                 wildcards: bool = True, server_side_copy: bool = True,
                 copy_cutoff: int = COPY_CUTOFF, object_metadata: Any = None,
                 jobs_widen: bool = False) -> None:
        #: Objects in flight widen with the link (``jobs`` the default, not a number given).
        self.jobs_widen = jobs_widen
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
        self.bucket_encryption: dict[tuple[int, str], asyncio.Future[str | None]] = {}
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
        widest = self.jobs
        if self.jobs_widen:
            widest += max(0, min(WIDEST * self.concurrency, MAX_THREADS) - self.concurrency)
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
        concurrency`` parts and objects in flight; objects only when no ``jobs`` was
        given: a number given is the most objects at once)."""
        objects: list[Any] = [self.job_slots, self.lane_objects] if self.jobs_widen else []
        self.width = Width([*objects, self.read_slots, self.lane_reads],
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
