"""How long the calling thread waited for I/O, as opposed to running or
waiting for a CPU.

A reader that receives its own stream spends wall time in three ways:
running (copying bytes out of the kernel, faulting pages in), waiting for a
CPU (a busy machine: other threads, other processes), and waiting for bytes
the link has not delivered. Only the last says that more connections would
help. Linux reports the first two per thread in ``/proc/thread-self/schedstat``
(nanoseconds on a CPU, nanoseconds runnable in a run queue); elsewhere only the
thread's CPU time is known, and waiting for a CPU counts as waiting for I/O
(the controller then pays a wasted try now and then, never a wrong answer
kept: tries are judged by the rate they deliver).
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["busy_seconds"]

_local = threading.local()


class _Schedstat:
    """This thread's ``schedstat`` descriptor, closed with the thread's locals when it
    ends: held as a bare number, every thread that ever read left one open (five per
    load of a checkpoint over HTTP, until the process ran out of descriptors)."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1

    def __del__(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError:  # pragma: no cover - interpreter teardown
                pass


def _schedstat() -> float | None:
    held = getattr(_local, "schedstat", None)
    if held is None:
        held = _local.schedstat = _Schedstat()
    fd = held.fd
    if fd < 0:
        return None
    try:
        on_cpu, runnable, _ = os.pread(fd, 96, 0).split(maxsplit=2)
        return (int(on_cpu) + int(runnable)) / 1e9
    except (OSError, ValueError):
        return None


def busy_seconds() -> float:
    """Seconds this thread has run or waited for a CPU (monotonic per thread):
    wall time minus the growth of this is time spent waiting for I/O."""
    value = _schedstat()
    return time.thread_time() if value is None else value
