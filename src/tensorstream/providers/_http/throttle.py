"""How many requests an origin takes at once, learnt from its throttling.

Why: object stores and HTTP servers answer a client that asks too much at
once with ``503`` (S3's ``SlowDown``) or ``429``; a proxy or server with a
per-client connection limit does the same. A load keeps tens of ranged GETs
in flight, so with a fixed width every retry lands on the same full server
and the load fails after its retries (or crawls, as fixed-width peers do).

Each origin (scheme, host, port) has one :class:`Gate` in the process, shared
by every provider and front door of the HTTP(S) data plane. It counts the
requests in flight (a request holds its slot until its body is read or
dropped) and, once the origin throttles, limits them the way TCP limits its
window (additive increase, multiplicative decrease):

* a throttled answer (``429``, ``503``) to a request sent since the last cut,
  while other requests were in flight, cuts the limit to :data:`DECREASE`
  times the requests then in flight (at least one). Answers to requests sent
  before that cut do not cut again: they tell of a width already given up. A
  request throttled alone says nothing of the width (an outage, another
  client) and cuts nothing;
* the width a cut was made at is remembered (its *ceiling*): a throttle at
  that width again or wider (the limit grew back into it) cuts only to one
  request below it, and after a deeper cut each answer adds ``1/2`` until
  the limit is one below the ceiling again (the way TCP CUBIC returns to
  the window it last lost at). A server whose width is fixed is then used
  nearly whole instead of 0.7-1 of it on a sawtooth; a throttle below the
  ceiling (the width the server takes shrank) cuts deep as before;
* every other answer adds ``1 / limit`` (about one more request per
  ``limit`` answers), so a limit lifted by the server is found again; after
  :data:`FORGET` seconds without a cut the limit is dropped (a long-lived
  process is not held narrow by one busy minute long ago);
* requests waiting for a slot are let in in the order they came, except
  that a thread whose last request was throttled goes first: its request is
  the retry of one the load already waited on (read-ahead is launched in
  reading order), so letting it queue behind read-ahead for later bytes
  would stall the reader;
* a request waits for a free slot before it is sent (bounded by its
  operation's deadline, and by its caller's cancellation), for
  :data:`MAX_WAIT` seconds at most: then it is sent anyway (the limit is a
  pace, never a lock: a thread that holds one body open while it waits for
  another request must not wait on itself);
* a slot that comes free wakes only the request first in line, and only when
  the limit lets it go (it then wakes the next, if the limit lets that one go
  too); waking every waiter on every answer made a throttled load spend its
  CPU handing the lock around (docs/benchmarks.md, session 29).

An origin that never throttles is never limited. :meth:`Gate.shared` tells the
retry layer whether other requests to the origin were in flight when one was
throttled: the throttle is then about the width, which is adapting, and the
request is retried with more patience (:mod:`tensorstream.layers.stack`); a
throttle of a request alone is the service failing, retried as any other.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

__all__ = ["DECREASE", "FORGET", "MAX_WAIT", "RECOVER", "THROTTLE_STATUSES", "Gate", "Slot", "gate"]

#: Statuses that ask the client to send less (S3 SlowDown is a 503).
THROTTLE_STATUSES = frozenset({429, 503})
#: A throttle cuts the limit to this share of the requests in flight.
DECREASE = 0.7
#: Below one request under the ceiling, each answer adds this much to the limit.
RECOVER = 0.5
#: The limit is dropped once it grows past this (the origin stopped throttling) ...
_UNLIMITED = 4096.0
#: ... or this many seconds after the last cut.
FORGET = 10.0
#: The longest a request waits for a slot before it is sent anyway (seconds).
MAX_WAIT = 2.0
#: Threads remembered as owed a first place (a bound: threads come and go).
_OWED_MAX = 1024
#: How often a waiting request re-checks its deadline and cancellation (seconds).
_POLL = 0.1

Key = tuple[str, str, int]


class Slot:
    """One request's place in its origin's :class:`Gate`; :meth:`leave` once
    (later calls do nothing) with the answer's status (``None``: no answer)."""

    __slots__ = ("_epoch", "_gate", "_lock", "_thread")

    def __init__(self, gate: Gate, epoch: int, thread: int) -> None:
        self._gate: Gate | None = gate
        self._epoch = epoch
        self._thread = thread  # the thread that asked (its retry goes first)
        self._lock = threading.Lock()

    def leave(self, status: int | None) -> None:
        with self._lock:
            gate, self._gate = self._gate, None
        if gate is not None:
            gate._leave(self._epoch, status, self._thread)


class Gate:
    """The requests in flight to one origin, and the limit its throttling set
    (``None``: not limited)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.limit: float | None = None
        #: The requests in flight at the last cut (``None`` with no limit).
        self.ceiling: int | None = None
        self.cuts = 0  # throttles that cut the limit (tests, metrics)
        self._epoch = 0  # bumped by every cut
        self._cut_at = 0.0  # monotonic time of the last cut
        #: Waiting requests, first in line first: each one's own condition.
        self._queue: collections.deque[threading.Condition] = collections.deque()
        self._owed: set[int] = set()  # threads whose last request was throttled

    def enter(self, deadline: float | None = None,
              cancelled: Callable[[], bool] | None = None) -> Slot | None:
        """A slot once the limit allows one more request (or :data:`MAX_WAIT`
        passed); ``None`` when the ``deadline`` (monotonic) passed or
        ``cancelled()`` said so first."""
        thread = threading.get_ident()
        with self._lock:
            if not self._queue and not self._limited():
                self.in_flight += 1  # the usual case: no limit, nobody waiting
                return Slot(self, self._epoch, thread)
            # Each waiter sleeps on a condition of its own (over the gate's lock):
            # a slot that comes free wakes the one first in line, not all of them.
            ticket = threading.Condition(self._lock)
            if thread in self._owed:
                self._owed.discard(thread)
                self._queue.appendleft(ticket)
            else:
                self._queue.append(ticket)
            try:
                until = time.monotonic() + MAX_WAIT
                while self._limited() and (not self._room() or self._queue[0] is not ticket):
                    now = time.monotonic()
                    if now >= until:
                        break
                    wait = min(_POLL, until - now)
                    if deadline is not None:
                        left = deadline - now
                        if left <= 0:
                            return None
                        wait = min(wait, left)
                    if cancelled is not None and cancelled():
                        return None
                    ticket.wait(wait)
                self.in_flight += 1
                return Slot(self, self._epoch, thread)
            finally:
                self._queue.remove(ticket)
                self._wake_first()  # the next in line may go (this one went, or gave up)

    def _room(self) -> bool:
        """Whether the limit lets one more request go now (under the lock)."""
        return self.limit is None or self.in_flight < max(1, int(self.limit))

    def _wake_first(self) -> None:
        """Wake the request first in line if it may go (under the lock): the
        limit has room, or there is no limit any more."""
        if self._queue and (self._room() or not self._limited()):
            self._queue[0].notify()

    def _limited(self) -> bool:
        if self.limit is not None and time.monotonic() - self._cut_at > FORGET:
            self.limit = self.ceiling = None
            self._owed.clear()
        return self.limit is not None

    def shared(self) -> bool:
        """Whether other requests are in flight beside the caller's (which holds
        its slot still)."""
        with self._lock:
            return self.in_flight > 1

    def _leave(self, epoch: int, status: int | None, thread: int) -> None:
        with self._lock:
            if status in THROTTLE_STATUSES:
                if len(self._owed) < _OWED_MAX:
                    self._owed.add(thread)
                # Sent at the current width, beside others: the width is too wide.
                if epoch == self._epoch and self.in_flight > 1:
                    width = self.in_flight
                    if self.ceiling is not None and width >= self.ceiling:
                        self.limit = float(width - 1)  # the ceiling held: stay just below it
                    else:
                        self.limit = max(1.0, width * DECREASE)
                    self.ceiling = width
                    self._epoch += 1
                    self.cuts += 1
                    self._cut_at = time.monotonic()
            elif status is not None and self._limited():
                assert self.limit is not None
                below = (self.ceiling or 0) - 1 - self.limit
                self.limit += min(RECOVER, below) if below > 0 else 1.0 / self.limit
                if self.limit > _UNLIMITED:
                    self.limit = self.ceiling = None
            self.in_flight -= 1
            self._wake_first()


_gates: dict[Key, Gate] = {}
_lock = threading.Lock()
_pid = os.getpid()


def _after_fork_in_child() -> None:
    """The parent's gates count its requests, and a thread of the parent may have
    held the lock at the fork (it does not exist here): both start afresh."""
    global _lock, _pid
    _lock = threading.Lock()
    _gates.clear()
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def gate(key: Key) -> Gate:
    """The process's gate of origin ``key`` (a forked child starts afresh: the
    parent's requests in flight are not its own)."""
    global _pid
    with _lock:
        if _pid != os.getpid():
            _gates.clear()
            _pid = os.getpid()
        found = _gates.get(key)
        if found is None:
            found = _gates[key] = Gate()
        return found
