"""The timeout layer: ``timeout_total`` and ``timeout_idle`` enforced inside
each attempt of an operation, not only between attempts.

It sits inside the retry layer (as OpenDAL's ``TimeoutLayer`` does): the
retry layer computes one total deadline per operation, and every attempt
runs under it.

* **async** attempts run under a watchdog (:func:`run_async`): the attempt is
  cancelled when the total deadline passes, or when no byte arrived for
  ``timeout_idle`` (providers report bytes with
  :func:`~tensorstream.providers.base.report_progress`; one that reports
  nothing must finish within the idle timeout). A provider that ignores every
  deadline is cut off all the same.
* **blocking** attempts (worker threads) cannot be cancelled from outside:
  :func:`run_blocking` publishes the deadline to the provider
  (:func:`~tensorstream.providers.base.current_deadline`), whose receive loop
  checks it between receives and bounds each receive by a socket timeout
  (the shared HTTP path does, :mod:`tensorstream.providers._http.range_get`);
  the layer refuses to start an attempt past the deadline.

A total deadline that passes is final (:class:`StorageTimeoutError` with
``temporary=False``: never retried); an idle timeout is temporary (retried,
resumed from the bytes received).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from ..config import Timeouts
from ..errors import StorageTimeoutError, TensorstreamError
from ..providers.deadline import _DEADLINE, Deadline, current_deadline

__all__ = [
    "IDLE_GRACE",
    "advise",
    "deadline_error",
    "operation",
    "operation_deadline",
    "past_total",
    "run_async",
    "run_blocking",
]

T = TypeVar("T")

#: Slack added to the layer's idle watchdog, so that a provider's own idle
#: timeout (which knows how many bytes arrived, for a resume) fires first.
IDLE_GRACE = 0.25


def operation_deadline(timeouts: Timeouts) -> float | None:
    """The ``time.monotonic()`` by which an operation starting now must end: now
    plus ``timeouts.total``, and never later than the operation it is part of
    (a file read made of several provider calls, see :func:`operation`)."""
    at = None if timeouts.total is None else time.monotonic() + timeouts.total
    outer = current_deadline()
    if outer is not None and outer.at is not None:
        at = outer.at if at is None else min(at, outer.at)
    return at


@contextlib.contextmanager
def operation(timeouts: Timeouts, at: float | None = None) -> Iterator[None]:
    """Make the calls inside one operation under ``timeout_total`` (e.g. one
    read of a file object, served by a stream and then by ranged requests);
    ``at``: the operation's deadline when it began before (a retried step)."""
    if timeouts.total is None:
        yield
        return
    token = _DEADLINE.set(Deadline(operation_deadline(timeouts) if at is None else at,
                                   timeouts.idle))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


#: Each timeout's option, the command line's flag for it (``None``: none) and what
#: ran out, for :func:`advise`.
_KNOBS = {
    "connect": ("timeout_connect", "--timeout-connect", "passed without a connection",
                "a server this far or this busy"),
    "idle": ("timeout_idle", "--timeout-idle", "passed without a byte", "a server this slow"),
    "total": ("timeout_total", "--timeout-total", "passed", "an operation this long"),
}


def advise(exc: StorageTimeoutError, timeouts: Timeouts) -> None:
    """Add to ``exc``'s message which timeout ran out, its value and what to
    raise it to (twice the value), once: "timed out after 0 bytes" named no option.

    >>> err = StorageTimeoutError("timed out after 0 bytes", timeout="idle")
    >>> advise(err, Timeouts(idle=0.5)); err.message  # doctest: +NORMALIZE_WHITESPACE
    'timed out after 0 bytes: timeout_idle=0.5 s passed without a byte (for a server this
    slow raise it, e.g. timeout_idle=1 or --timeout-idle 1)'
    """
    knob = _KNOBS.get(exc.timeout or "")
    if knob is None or exc.advised:
        return
    option, flag, what, who = knob
    value = getattr(timeouts, option.removeprefix("timeout_"))
    if value is None:  # (a total deadline of an outer operation: not this config's)
        return
    more = f"{value * 2:.3g}"
    how = f"{option}={more}" + (f" or {flag} {more}" if flag else "")
    exc.message += f": {option}={value:g} s {what} (for {who} raise it, e.g. {how})"
    exc.advised = True


def past_total(exc: TensorstreamError, wait: float, total: float | None,
               again: str = "retrying") -> TensorstreamError:
    """``exc``, its message saying that the wait before the next attempt (``again``
    in ``wait`` s) would pass the total deadline, and what to raise it to: the
    attempt is not made, and ``exc`` is the error the operation ends with."""
    note = StorageTimeoutError(f"{exc.message}; {again} in {wait:.3g} s would pass the total "
                               "deadline", timeout="total")
    advise(note, Timeouts(total=total))
    exc.message = note.message
    return exc


def _where(service: str | None, path: str | None) -> dict[str, str]:
    return {k: v for k, v in (("service", service), ("path", path)) if v is not None}


def deadline_error(total: float | None, *, received: int = 0,
                   service: str | None = None, path: str | None = None) -> StorageTimeoutError:
    """The final error of an operation whose total deadline passed."""
    err = StorageTimeoutError("the operation ran past its total deadline", received=received,
                              timeout="total", **_where(service, path))
    err.temporary = False  # the whole budget is spent: retrying cannot help
    if total is None:
        err.message += " (timeout_total)"
    else:
        advise(err, Timeouts(total=total))
    return err


def _idle_error(timeouts: Timeouts, *, service: str | None, path: str | None
                ) -> StorageTimeoutError:
    err = StorageTimeoutError("nothing arrived", received=0, timeout="idle",
                              **_where(service, path))
    advise(err, timeouts)
    return err


async def run_async(fn: Callable[[], Awaitable[T]], timeouts: Timeouts, at: float | None, *,
                    service: str | None = None, path: str | None = None) -> T:
    """Run one async attempt under the total deadline ``at`` and the idle timeout."""
    if at is not None and time.monotonic() >= at:
        raise deadline_error(timeouts.total, service=service, path=path)
    deadline = Deadline(at, timeouts.idle)
    token = _DEADLINE.set(deadline)
    try:
        task = asyncio.current_task()
        if task is None or (at is None and timeouts.idle is None):
            return await fn()
        return await _watched(fn, task, deadline, timeouts, service=service, path=path)
    finally:
        _DEADLINE.reset(token)


async def _watched(fn: Callable[[], Awaitable[T]], task: asyncio.Task[object],
                   deadline: Deadline, timeouts: Timeouts, *, service: str | None,
                   path: str | None) -> T:
    """Await ``fn()``, cancelling it when a deadline passes (the watchdog is one
    timer, re-armed lazily: progress reports only store a timestamp)."""
    loop = asyncio.get_running_loop()
    idle = timeouts.idle
    fired: list[str] = []
    handle: list[asyncio.TimerHandle] = []

    def check() -> None:
        idle_due = deadline.last + idle + IDLE_GRACE if idle is not None else math.inf
        total_due = deadline.at if deadline.at is not None else math.inf
        when, why = (total_due, "total") if total_due <= idle_due else (idle_due, "idle")
        now = time.monotonic()
        if when <= now:
            fired.append(why)
            task.cancel()
        else:
            handle[:] = [loop.call_at(loop.time() + (when - now), check)]

    check()
    cancelled = False
    try:
        return await fn()
    except asyncio.CancelledError:
        cancelled = True
        if not fired or _uncancel(task) > 0:
            raise  # not ours, or cancelled from outside as well
        if fired[0] == "total":
            raise deadline_error(timeouts.total, service=service, path=path) from None
        raise _idle_error(timeouts, service=service, path=path) from None
    finally:
        for h in handle:
            h.cancel()
        if fired and not cancelled:
            _uncancel(task)  # the attempt ended (or turned the cancel into an error) first


def _uncancel(task: asyncio.Task[object]) -> int:
    """Withdraw one cancellation request (Python 3.11+); the requests left."""
    uncancel = getattr(task, "uncancel", None)
    return int(uncancel()) if uncancel is not None else 0


def run_blocking(fn: Callable[[], T], timeouts: Timeouts, at: float | None, *,
                 service: str | None = None, path: str | None = None) -> T:
    """Run one blocking attempt with its deadlines published to the provider."""
    if at is not None and time.monotonic() >= at:
        raise deadline_error(timeouts.total, service=service, path=path)
    token = _DEADLINE.set(Deadline(at, timeouts.idle))
    try:
        return fn()
    finally:
        _DEADLINE.reset(token)
