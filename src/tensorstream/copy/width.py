"""How many parts a copy keeps in flight: as many as its link needs.

A copy starts ``concurrency`` parts wide. Every :data:`LOOK` seconds
:class:`Width` asks whether the link, not the CPU, is the limit, and follows
the answer both ways, between ``concurrency`` and its cap:

* **wider** (doubling) when every slot is taken and, of the bytes the parts
  asked of the process's receiving thread
  (:mod:`tensorstream.providers._http.receiver`, which receives every part's
  body) during the window, :data:`WAITING` or less had arrived already: the
  connections, not this process, are the limit (object stores and paced links
  cap each connection). The signal holds on a loaded machine, where the old
  one (this process using little CPU while the machine has idle CPU,
  :func:`link_bound`, still consulted for sources without a receiving
  thread) never fires: a starved process also uses little CPU, but finds
  its bytes waiting whenever it runs.
* **narrower** (by half the excess) when :data:`BUSY` or more had arrived:
  the process is the limit, and more connections only add threads handing
  the interpreter lock to each other.

The shares measured on each link are in docs/benchmarks.md ("`cp`: a width
that follows the link").

A copy's parts start :data:`START` wide (at most ``concurrency``): on a link
faster than the process, more parts in flight only add threads contending for
the interpreter lock and a 1 MiB chunk buffer each to fault in. The first
widening goes straight to ``concurrency``, then it doubles as above
(docs/benchmarks.md, "`cp` of a folder: where the CPU and the switches go").

One object's parts stay at ``concurrency`` (``_Copier._run_parts``): the
extra width is for more objects. The cap is ``WIDEST x concurrency`` (at
most the data plane's thread count,
:data:`~tensorstream.providers._http.threads.MAX_THREADS`): memory to a local
destination is one 1 MiB chunk buffer per part in flight, so at most ``4 x
concurrency`` MiB (128 MiB at the defaults); to S3 and Redis the part pool
bounds it whatever the width (a wider copy waits for pool buffers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ..providers._http import receiver
from ..providers._http.threads import MAX_THREADS, prestart
from .tasks import cancel_and_wait

__all__ = ["BUSY", "ENOUGH", "FDS_PER_PART", "LOOK", "START", "WAITING", "WIDEST", "CPUSample",
           "Sample", "Slot", "Width", "descriptor_room", "link_bound", "ready_share"]

log = logging.getLogger("tensorstream.copy")

#: How often the width is looked at (seconds): a folder of small objects is
#: copied in well under a second, so the first answer must come early.
LOOK = 0.05
#: At most this share of the bytes asked for had arrived already: the link is the limit.
WAITING = 0.25
#: At least this share had: the CPU is the limit.
BUSY = 0.6
#: Bytes a window must have asked for to tell either (fewer: no change).
ENOUGH = 1 << 20
#: The widest a copy goes, in multiples of ``concurrency``.
WIDEST = 4
#: Parts in flight when a copy starts (at most ``concurrency``).
START = 8
#: Descriptors one part or object in flight may hold at once (the socket, an idle
#: pooled connection, the destination's directory, temp file and its ``O_DIRECT``
#: twin): the width stays within what the open-file limit leaves.
FDS_PER_PART = 5
#: Descriptors left for everything else (listings, the event loop, logging, the caller's).
_FD_RESERVE = 32
#: The old, idle-machine rule (:func:`link_bound`): under this share of one
#: core the process is waiting on something, ...
_LINK_BOUND = 0.5
#: ... and this share of the machine's CPU must be idle for that to be the link.
_MACHINE_IDLE = 0.25

#: (wall seconds, this process's CPU seconds, the machine's idle and total jiffies).
CPUSample = tuple[float, float, int, int]


@dataclasses.dataclass(frozen=True)
class Sample:
    """What :class:`Width` compares between two looks."""

    wall: float
    asked: int  # the receiving thread's :func:`~.receiver.arrivals`
    ready: int
    cpu: CPUSample | None

    @classmethod
    def now(cls) -> Sample:
        asked, ready = receiver.arrivals()
        return cls(time.perf_counter(), asked, ready, _cpu_sample())


def _cpu_sample() -> CPUSample | None:
    """Now, with the machine's CPU counters (``/proc/stat``); None where there are none."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return time.perf_counter(), time.process_time(), idle, sum(fields)


def link_bound(before: CPUSample, now: CPUSample) -> bool:
    """Whether a copy waited on its link between two samples by the idle-machine
    rule: this process used less than half a core *and* the machine had a
    quarter or more of its CPU idle (a starved process also uses little CPU)."""
    wall = now[0] - before[0]
    total = now[3] - before[3]
    if wall <= 0 or total <= 0:
        return False
    busy = (now[1] - before[1]) / wall
    idle = (now[2] - before[2]) / total
    return busy < _LINK_BOUND and idle >= _MACHINE_IDLE


def ready_share(before: Sample, now: Sample) -> float | None:
    """Of the bytes asked of the receiving thread between two samples, the
    share that had arrived already when asked for; None when too little was
    asked to tell (:data:`ENOUGH`)."""
    asked = now.asked - before.asked
    return (now.ready - before.ready) / asked if asked >= ENOUGH else None


def descriptor_room() -> int | None:
    """How many parts this process's open-file limit (``RLIMIT_NOFILE``'s soft
    limit, less the descriptors open now and a reserve) leaves room for, at
    :data:`FDS_PER_PART` each, at least one; None where it cannot tell or there
    is no limit. (Under ``ulimit -n 256`` a wide copy of many objects failed
    with "Too many open files".)"""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return None
        open_now = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, ValueError):
        return None
    return max(1, (soft - open_now - _FD_RESERVE) // FDS_PER_PART)


class Slot(Protocol):
    """What :class:`Width` moves: ``asyncio.Semaphore``'s names."""

    def locked(self) -> bool: ...
    def release(self) -> None: ...
    async def acquire(self) -> Any: ...


class Width:
    """The width of one copy: extra permits of its slots (``asyncio.Semaphore``\\s
    that together bound the parts and objects in flight), added and taken back.

    Widening releases one more permit of every slot; narrowing takes one of
    each back (a task waits for it the way an object does, so nothing in
    flight is stopped) and holds it until the copy widens again or ends.

    ``start``: the slots that bound the parts in flight (one, or a sequence
    of them), made with ``width`` permits (fewer than ``base``): the copy
    starts that narrow, and its first widening gives those slots the rest of
    ``base``. A slot is an ``asyncio.Semaphore`` or anything with its
    ``locked``, ``release`` and ``acquire`` (the lane's
    :class:`~tensorstream.copy.lane.ThreadSlots`)."""

    def __init__(self, slots: Sequence[Slot], base: int,
                 widest: int = WIDEST,
                 start: tuple[Slot | Sequence[Slot], int] | None = None,
                 most: int | None = None) -> None:
        self.slots = list(slots)
        self.base = base
        self.cap = max(base, min(widest * base, MAX_THREADS))
        if most is not None:  # (the open-file limit: :func:`descriptor_room`)
            self.cap = max(base, min(self.cap, most))
        self.width = base
        self._short: list[Slot] | None = None
        if start is not None and start[1] < base:
            short, self.width = start
            self._short = list(short) if isinstance(short, Sequence) else [short]
        self.most = self.width  # the widest it went (statistics, tests)
        self._held: list[asyncio.Task[None]] = []

    def full(self) -> bool:
        """Whether every permit of some slot is taken (a wider copy would start more)."""
        return any(s.locked() for s in self.slots)

    def widen(self) -> int:
        """Double the width (up to the cap), or from a narrow start straight to
        ``base``; returns how many permits were added."""
        if self._short is not None:
            step = self.base - self.width
            for _ in range(step):
                for s in self._short:
                    s.release()
            self._short, self.width = None, self.base
            self.most = max(self.most, self.width)
            prestart(self.width)
            return step
        step = min(self.cap - self.width, self.width)
        if step <= 0:
            return 0
        self.width += step
        self.most = max(self.most, self.width)
        prestart(self.width)  # the worker threads start now, not one per new part
        for _ in range(step):
            if self._held:
                self._give_back(self._held.pop())
            else:
                for s in self.slots:  # a Semaphore takes extra releases: more permits
                    s.release()
        return step

    def narrow(self) -> int:
        """Halve the width above ``base``; returns how many permits are taken back."""
        step = max(0, (self.width - self.base + 1) // 2)
        for _ in range(step):
            self._held.append(asyncio.ensure_future(self._take()))
        self.width -= step
        return step

    async def _take(self) -> None:
        taken: list[Slot] = []
        try:
            for s in self.slots:  # in the order objects take them: no deadlock
                await s.acquire()
                taken.append(s)
        except BaseException:
            for s in taken:
                s.release()
            raise

    def _give_back(self, task: asyncio.Task[None]) -> None:
        if task.done() and not task.cancelled() and task.exception() is None:
            for s in self.slots:
                s.release()
        else:
            task.cancel()  # still waiting: it gives back what it took

    async def close(self) -> None:
        """Stop every narrowing still waiting (the copy is over)."""
        held, self._held = self._held, []
        await cancel_and_wait(held)

    async def follow(self) -> None:
        """Look every :data:`LOOK` seconds and widen or narrow (see the module
        docstring); runs until cancelled."""
        try:
            before = Sample.now()
            while True:
                await asyncio.sleep(LOOK)
                now = Sample.now()
                share = ready_share(before, now)
                idle_rule = (before.cpu is not None and now.cpu is not None
                             and link_bound(before.cpu, now.cpu))
                before = now
                waiting = idle_rule or (share is not None and share <= WAITING)
                if waiting and self.full():
                    if self.widen():
                        log.debug("cp: the link is the limit (%s ready): %d parts in flight",
                                  _pct(share), self.width)
                elif share is not None and share >= BUSY and self.width > self.base:
                    self.narrow()
                    log.debug("cp: the CPU is the limit (%s ready): %d parts in flight",
                              _pct(share), self.width)
        finally:
            await self.close()


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"
