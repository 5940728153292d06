"""How many Redis interactions a provider runs at once: as many as asked for,
until the server refuses a connection for its ``maxclients``.

A server with few free connections answers a new one with "max number of
clients reached" and closes it: the command never ran. ``cp`` opened up to
~16 connections and failed there, while a load (a few) worked. A refusal while
other interactions of this provider hold connections narrows the width to
those (they are what the server allows) and the refused interaction waits for
one of them, then runs again; one refused while no other runs lets go of the
provider's idle connections (held for nothing, they may be what is missing)
once, and then fails with a clear error. A narrowed width grows again by one
every :data:`_GROW_AFTER` interactions that went well, so a long-lived provider
does not keep one connection for good after a moment the server was full.

The width is shared by the asyncio client and the blocking readers' client
(one server counts both), so it is guarded by a thread lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator

from ...errors import ConnectionFailedError

__all__ = ["NARROWED", "NONE_FREE", "RETRY_IDLE", "Width", "no_connection_error", "refused"]

#: What a refused interaction does next (:meth:`Width.refused`).
NARROWED, RETRY_IDLE, NONE_FREE = "narrowed", "retry-idle", "none-free"

_MAX_CLIENTS = "max number of clients reached"
#: (seconds) the first and longest pause of an asyncio wait for a free slot
_POLL_FIRST, _POLL_MOST = 0.001, 0.05
#: A narrowed width grows by one after this many interactions that went well (the
#: other clients may have left; one refused try costs nothing: its command never ran).
_GROW_AFTER = 64


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it chains) is the server refusing a new
    connection for its ``maxclients``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if _MAX_CLIENTS in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def no_connection_error() -> ConnectionFailedError:
    """The error of an interaction refused when no other held a connection."""
    return ConnectionFailedError(
        f"Redis refused every connection: {_MAX_CLIENTS} (all of the server's maxclients "
        "are taken by other clients); try again once some leave, or raise maxclients "
        "(CONFIG SET maxclients N)")


class Width:
    """The number of interactions running (each holding one connection) and,
    once the server refused one, the most that may run at once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        _widths.add(self)
        #: None: not limited (the client's own pool size applies)
        self.limit: int | None = None
        self._went_well = 0  # interactions that went well since the width last changed

    def __repr__(self) -> str:
        return f"Width(running={self._running}, limit={self.limit})"

    def _after_fork(self) -> None:
        """In a forked child: the parent's interactions do not run here (they held
        slots for ever), and a thread of the parent may have held the lock."""
        self._cond = threading.Condition()
        self._running = 0

    def _enter(self) -> bool:
        with self._cond:
            if self.limit is not None and self._running >= self.limit:
                return False
            self._running += 1
            return True

    def _leave(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def slot_blocking(self) -> Iterator[None]:
        """Hold one slot (waiting in this thread for one to be free)."""
        with self._cond:
            while self.limit is not None and self._running >= self.limit:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            self._leave()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot (polling while none is free: a thread lock cannot be
        awaited, and the wait only happens against a server that is full)."""
        pause = _POLL_FIRST
        while not self._enter():
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_MOST)
        try:
            yield
        finally:
            self._leave()

    def went_well(self) -> None:
        """Count an interaction that had its connection: a narrowed width grows by
        one every :data:`_GROW_AFTER` of them."""
        if self.limit is None:
            return
        with self._cond:
            if self.limit is None:
                return
            self._went_well += 1
            if self._went_well >= _GROW_AFTER:
                self._went_well = 0
                self.limit += 1
                self._cond.notify_all()

    def refused(self, *, idle_dropped: bool) -> str:
        """Called by an interaction the server refused, while it holds its slot:
        :data:`NARROWED` (others hold connections: the width is now theirs; run
        again), :data:`RETRY_IDLE` (none do: let go of idle connections and run
        again) or :data:`NONE_FREE` (that was done already: fail)."""
        with self._cond:
            others = self._running - 1
            if others >= 1:
                self.limit = others if self.limit is None else min(self.limit, others)
                self._went_well = 0
                return NARROWED
        return NONE_FREE if idle_dropped else RETRY_IDLE

    def after_failure(self, err: BaseException, *, idle_dropped: bool) -> str:
        """What an interaction that failed with ``err`` does next, while it holds its
        slot: raise ``err`` (any other failure), raise :func:`no_connection_error`
        (refused with none free), or run again (:data:`NARROWED`, :data:`RETRY_IDLE`:
        let go of idle connections first). The one decision of the blocking and
        the asyncio clients."""
        if not refused(err):
            raise err
        step = self.refused(idle_dropped=idle_dropped)
        if step == NONE_FREE:
            raise no_connection_error() from err
        return step


#: Every width of this process (weak), made the forked child's own.
_widths: weakref.WeakSet[Width] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for width in list(_widths):
        width._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
