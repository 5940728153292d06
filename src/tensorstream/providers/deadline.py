"""The deadlines of the operation running now: set by the timeout layer
(:mod:`tensorstream.layers.timeout`), read by providers that can enforce them inside
a request (:func:`current_deadline`), told of progress (:func:`report_progress`)."""

from __future__ import annotations

import contextvars
import time

from ..errors import StorageTimeoutError
from ..uri import redact_text

__all__ = ["Deadline", "current_deadline", "report_progress"]


class Deadline:
    """The deadlines of the operation running now (set by the timeout layer,
    read by providers that can enforce them inside a request).

    ``at`` is the ``time.monotonic()`` by which the whole operation must end
    (``None``: no total deadline); ``idle`` bounds the wait for each next
    byte. :meth:`progress` records that bytes arrived (the layer's idle
    watchdog for async attempts reads :attr:`last`).
    """

    __slots__ = ("at", "idle", "last")

    def __init__(self, at: float | None, idle: float | None) -> None:
        self.at = at
        self.idle = idle
        self.last = time.monotonic()

    def progress(self) -> None:
        self.last = time.monotonic()

    def remaining(self) -> float | None:
        """Seconds left before the total deadline (``None``: no total deadline)."""
        return None if self.at is None else self.at - time.monotonic()

    def wait_bound(self) -> float | None:
        """The longest a single receive may block now: the idle timeout, cut to
        what is left of the total deadline (at least a millisecond)."""
        left = self.remaining()
        if left is None:
            return self.idle
        left = max(left, 0.001)
        return left if self.idle is None else min(self.idle, left)

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def error(self, received: int = 0, *, service: str | None = None,
              path: str | None = None) -> StorageTimeoutError:
        """The final error of an operation whose total deadline passed
        (``temporary=False``: the budget is spent, retrying cannot help)."""
        where = {k: v for k, v in (("service", service), ("path", redact_text(path or "")))
                 if v}
        err = StorageTimeoutError(f"the operation ran past timeout_total after {received} bytes",
                                  received=received, timeout="total", **where)
        err.temporary = False
        return err


_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "tensorstream_deadline", default=None)


def current_deadline() -> Deadline | None:
    """The deadlines of the operation running in this task or thread, if any."""
    return _DEADLINE.get()


def report_progress() -> None:
    """Tell the timeout layer that bytes arrived (cheap; call once per chunk).

    A provider whose single read may run longer than ``timeout_idle`` must
    call it, or the layer takes the silence for a stall."""
    deadline = _DEADLINE.get()
    if deadline is not None:
        deadline.last = time.monotonic()
