"""The lane: objects of one part into local files, each run start to end by one thread.

A folder of small objects is mostly per-object work. On the event loop each
object is a task, a hand-off to a worker thread and back, and a wake-up of
the loop when its read slot is handed back: two wake-ups of the loop and a
thread hand-off per object, each a trip through the interpreter lock. In
the lane, a few long-lived worker threads take objects from one shared
list and run each start to end (:meth:`.local.LocalCopy.prepare`: temp
file, the GET, the body into the file, the publish), recording its outcome
themselves; the event loop is not involved per object.

The lane's width is two :class:`ThreadSlots` (objects in flight, and reads
in flight: a read slot is handed back once the object's bytes are in, so
the next GET goes out while this one is made durable), moved by the copy's
:class:`~tensorstream.copy.width.Width` like its asyncio slots. A copy whose
objects are not all of one part runs the others on the event loop beside
the lane, each population within the width.

An answer that did not name the source's version leaves its object to the
event loop (:meth:`.local.LocalCopy.finish`: the source's validators are
compared again before the file is published); the thread goes on to the next.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..providers._http.connections import current
from ..providers._http.threads import in_thread
from .local import LocalCopy, one_hop
from .tasks import cancel_and_wait

if TYPE_CHECKING:
    from .copier import _Copier
    from .job import Job
    from .select import FileOutcome

__all__ = ["ThreadSlots", "run_lane", "takes"]


class ThreadSlots:
    """A semaphore for worker threads whose permits the event loop adds and
    takes back: :meth:`take`/:meth:`give` (threads), and the names of
    ``asyncio.Semaphore`` that :class:`~tensorstream.copy.width.Width` uses
    (``locked``, ``release`` adds a permit, ``acquire`` takes one back at
    once: a thread holding it keeps it until it gives it back, and no thread
    gets a new one until the count is positive again)."""

    def __init__(self, permits: int) -> None:
        if permits < 0:
            raise ValueError("permits must be >= 0")
        self._free = permits
        #: Permits in existence (taken or not): the width.
        self.total = permits
        self._cond = threading.Condition(threading.Lock())
        #: Called (on the event loop) after :meth:`release` added a permit.
        self.on_release: Callable[[], None] | None = None

    def take(self) -> None:
        """Wait for a permit (a worker thread)."""
        with self._cond:
            while self._free <= 0:
                self._cond.wait()
            self._free -= 1

    def give(self) -> None:
        """Hand a permit back (a worker thread)."""
        with self._cond:
            self._free += 1
            self._cond.notify()

    def locked(self) -> bool:
        """Whether every permit is taken (the width is the limit)."""
        return self._free <= 0

    def release(self) -> None:
        """One more permit (the copy widens)."""
        with self._cond:
            self.total += 1
            self._free += 1
            self._cond.notify()
        if self.on_release is not None:
            self.on_release()

    async def acquire(self) -> None:
        """One permit fewer (the copy narrows); never waits."""
        with self._cond:
            self.total -= 1
            self._free -= 1


def takes(c: _Copier, job: Job) -> bool:
    """Whether the lane runs ``job``: one part into a local file
    (:func:`.local.one_hop`) from a source whose ranged streams are read in
    the worker thread itself, never through the event loop (HTTP(S), S3)."""
    return one_hop(c, job) and job.src.capabilities.range_streams


#: (the object's copy, bytes resumed, its outcome, when it started)
_HandedBack = tuple[LocalCopy, int, "FileOutcome", float]


class _Lane:
    def __init__(self, c: _Copier, jobs: list[Job], objects: ThreadSlots, reads: ThreadSlots,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.c, self.loop = c, loop
        self.objects, self.reads = objects, reads
        self._todo: Iterator[Job] = iter(jobs)
        self._lock = threading.Lock()
        #: Objects whose answer did not name its version: finished on the loop.
        self.handed_back: asyncio.Queue[_HandedBack | None] = asyncio.Queue()

    def _next(self) -> Job | None:
        with self._lock:
            return next(self._todo, None)

    def work(self) -> None:
        """One lane thread: objects until none is left or the copy is cancelled."""
        cancel = current.cancel
        while cancel is None or not cancel.cancelled:
            job = self._next()
            if job is None:
                return
            self.objects.take()
            try:
                self._one(job)
            finally:
                self.objects.give()

    def _one(self, job: Job) -> None:
        c = self.c
        out, t0 = c.begin(job)
        op = LocalCopy(c, job, self.loop)
        reading = [True]

        def received() -> None:
            if reading[0]:
                reading[0] = False
                self.reads.give()

        self.reads.take()
        try:
            resumed, pinned = op.prepare(received)
        except BaseException as exc:
            received()
            op.abandon(exc)
            cancelled = current.cancel is not None and current.cancel.cancelled
            c.ended(job, out, t0, exc, interrupted=cancelled)
            if not isinstance(exc, Exception):
                raise
            return
        received()
        if pinned:
            op.close()
            c.ended(job, out, t0, None, resumed=resumed)
            return
        # The rest needs the event loop (the source's validators compared again).
        self.loop.call_soon_threadsafe(self.handed_back.put_nowait, (op, resumed, out, t0))

    async def finish_handed_back(self) -> None:
        """Finish, on the loop, the objects the threads handed back; ends at ``None``."""
        while True:
            item = await self.handed_back.get()
            if item is None:
                return
            op, resumed, out, t0 = item
            job = op.job
            try:
                resumed = await op.complete(resumed, False)
            except Exception as exc:
                self.c.ended(job, out, t0, exc)
                continue
            except BaseException as exc:
                self.c.ended(job, out, t0, exc, interrupted=True)
                raise
            self.c.ended(job, out, t0, None, resumed=resumed)


async def run_lane(c: _Copier, jobs: list[Job], objects: ThreadSlots, reads: ThreadSlots,
                   threads: int) -> None:
    """Copy ``jobs`` (each :func:`takes`) on ``threads`` lane threads within
    ``objects`` and ``reads``; outcomes are recorded as each object ends."""
    if not jobs:
        return
    lane = _Lane(c, jobs, objects, reads, asyncio.get_running_loop())
    finishing = asyncio.ensure_future(lane.finish_handed_back())
    work: Callable[[], None] = lane.work
    workers: list[asyncio.Future[None]] = []
    more = asyncio.Event()

    def grow() -> None:
        # Threads for every read slot, and a few for objects being made
        # durable while the next GETs go out; no more than objects to copy.
        want = min(threads, len(jobs), objects.total,
                   reads.total + max(1, reads.total // 4))
        for _ in range(want - len(workers)):
            workers.append(asyncio.ensure_future(in_thread(work)))
        more.set()

    grow()
    reads.on_release = objects.on_release = grow
    try:
        while True:  # until every thread has ended, counting those the width adds
            more.clear()
            pending: list[asyncio.Future[Any]] = [w for w in workers if not w.done()]
            if not pending:
                break
            waiter: asyncio.Future[Any] = asyncio.ensure_future(more.wait())
            try:
                await asyncio.wait([*pending, waiter], return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            for w in workers:
                if w.done():
                    w.result()  # a thread's own failure (never an object's) ends the lane
        lane.handed_back.put_nowait(None)
        await finishing
    finally:
        reads.on_release = objects.on_release = None
        await cancel_and_wait([*workers, finishing])
        # An object handed back but never finished (the copy was cancelled).
        while not lane.handed_back.empty():
            item = lane.handed_back.get_nowait()
            if item is not None:
                op, _, out, t0 = item
                op.abandon(asyncio.CancelledError())
                c.ended(op.job, out, t0, asyncio.CancelledError(), interrupted=True)
