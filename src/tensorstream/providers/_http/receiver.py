"""One thread receives the bodies of many connections (epoll), straight into
their destinations.

Why: a load on a paced link keeps tens of requests in flight. With one
blocking thread per connection, every arrival wakes its own thread and each
takes the GIL; on two cores those threads spend their time handing the GIL
to each other. Here the requesting threads send the request and read the
status line and headers as before (:mod:`.range_get`), then hand the socket
and the destination ``memoryview`` to the process's :class:`Receiver` and
sleep until the body is in. Its one thread waits on all the sockets at once
and ``recv_into``\\s each socket's bytes at their place in the destination
(no intermediate buffer): a few thousand receives a second for 64
connections at 25 MB/s, and no convoy.

Semantics are those of a blocking receive, so the callers above (retries,
resume, pinning, deadlines) do not change:

* :meth:`Receiver.receive` fills the whole view or raises
  :class:`ReceiveError`, whose ``received`` counts the bytes that landed and
  whose ``error`` is the transport error (``TimeoutError`` for an idle or
  total deadline, ``OSError``/``ssl.SSLError`` as raised, ``EOFError`` when the
  peer closed first);
* the idle bound is the socket's timeout when the receive starts (what the
  caller set: ``timeout_idle``, cut to the operation's total deadline); a
  :class:`~tensorstream.providers.base.Deadline` passed in is checked while
  waiting and told of every arrival (an async caller's idle watchdog reads it);
* when :meth:`Receiver.receive` returns or raises, the receiving thread no
  longer touches the view (a transfer is finished under its lock), so nothing
  writes into a caller's buffer after the call;
* shutting the socket down from another thread (a cancelled caller) ends the
  receive at once with an error;
* TLS sockets work: ``SSLWantReadError`` is "nothing yet", and a socket is
  read until the TLS layer has nothing left (decrypted bytes buffered inside
  it are invisible to epoll).

The socket's low-water mark (``SO_RCVLOWAT``, which epoll honours) wakes the
thread once per ``lowat`` bytes of a connection rather than once per packet.
The thread is started on first use and replaced in a forked child.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence

from ..base import Deadline

__all__ = [
    "LOWAT", "arrivals", "SHARED_DEFAULT", "ReceiveError", "Receiver", "receiver", "shared_receiving",
    "shares_receiving",
]

#: Wake for a connection once per this many bytes at most (its ``SO_RCVLOWAT``).
LOWAT = 256 << 10
#: A connection's receive window at least (:func:`_widen`).
WINDOW = 2 << 20
#: Bytes a connection carries before its receives count in :attr:`Receiver.ready`:
#: a new connection's first bytes trickle in (TCP's window is still growing)
#: whatever the link, and on loopback they looked like a slow link.
WARM = 1 << 20
#: Bytes a TLS layer may hold of a record it has not decrypted yet: the
#: low-water mark stays this far below what the body still owes, so it can
#: always be reached.
_MARGIN = 64 << 10
#: Receives per socket per wake-up at most (fairness between connections).
_BURST = 16
#: How often a waiting caller re-checks its deadlines with no news (seconds).
_POLL = 1.0


class ReceiveError(Exception):
    """A receive that did not fill its view: ``received`` bytes landed (from its
    start), then ``error`` (also the ``__cause__``) ended it."""

    def __init__(self, received: int, error: BaseException) -> None:
        super().__init__(f"receive ended after {received} bytes: {error!r}")
        self.received = received
        self.error = error
        self.__cause__ = error


class _Transfer:
    __slots__ = ("at", "deadline", "done", "error", "event", "fd", "index", "last", "lock",
                 "lowat", "pos", "sock", "views", "want", "write")

    def __init__(self, sock: socket.socket, views: list[memoryview],
                 deadline: Deadline | None) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.views = views  # filled in turn (a body spanning several buffers)
        self.want = sum(len(v) for v in views)
        self.index = 0  # the view being filled ...
        self.at = 0  # ... and where in it
        self.pos = 0  # bytes received in all
        self.deadline = deadline
        self.lock = threading.Lock()  # held while bytes are written into the view
        self.event = threading.Event()
        self.done = False
        self.error: BaseException | None = None
        self.last = time.monotonic()  # the last arrival
        self.lowat = 1
        self.write = False  # registered for writability too (TLS wants to write)


def _lowat(left: int) -> int:
    return max(1, min(LOWAT, left - _MARGIN))


def _widen(sock: socket.socket) -> None:
    """Give ``sock`` a receive buffer of :data:`WINDOW` bytes or more, still tuned
    by the kernel (best effort).

    Why: the kernel sizes a connection's buffer from the bytes it carries per
    round trip, tiny next door (a server on loopback or in the same zone), so
    a paced connection's window stays a few hundred KiB, and the sender stops
    whenever this thread is late by that much (docs/benchmarks.md, "Session
    26"). Raising the low-water mark grows the buffer without locking it
    (``SO_RCVBUF`` would lock it, at most ``net.core.rmem_max``, and turn the
    kernel's tuning off); the caller then sets the mark it wants.
    """
    with contextlib.suppress(OSError):
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < WINDOW:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, WINDOW)


class Receiver:
    """Receives many sockets' bodies on one thread (see the module docstring)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._transfers: dict[int, _Transfer] = {}
        self._thread = threading.Thread(target=self._run, name="tensorstream-receiver",
                                        daemon=True)
        self._thread.start()
        self.receives = 0  # recv calls made (statistics, tests)
        self.wakeups = 0  # epoll wake-ups with work (statistics, tests)
        #: Bytes asked of :meth:`receive` on warm connections (:data:`WARM`),
        #: and of those the bytes that had arrived already when it was called:
        #: a link that is the limit has little waiting, a busy CPU finds most
        #: of it there (``cp`` follows the link by it,
        #: :mod:`tensorstream.copy.width`). Unlocked: approximate.
        self.asked = 0
        self.ready = 0
        # Bytes each socket (by fd, at most one entry per descriptor number) has
        # carried; a later connection on a reused number counts as warm at once.
        self._carried: dict[int, int] = {}

    # -- the caller's side -------------------------------------------------------------
    def receive(self, sock: socket.socket, view: memoryview | Sequence[memoryview], *,
                deadline: Deadline | None = None) -> int:
        """Receive exactly ``len(view)`` bytes from ``sock`` into ``view``, or
        fill each of a sequence of views in turn (one hand-off for a body that
        lands in several buffers; ``ReceiveError.received`` then counts from
        the first view's start).

        ``sock`` must have nothing buffered above it (an ``http.client``
        response's buffered bytes are taken first by the caller). Its
        timeout is the idle bound and is restored afterwards; the socket is
        non-blocking while the receiver owns it.
        """
        views = [view] if isinstance(view, memoryview) else [v for v in view if len(v)]
        t = _Transfer(sock, views, deadline)
        want = t.want
        if want == 0:
            return 0
        idle = sock.gettimeout()
        try:
            sock.setblocking(False)
            # What has arrived already is taken by this thread, awake anyway: a
            # small body that came with its headers costs no hand-off at all.
            self._pump(t)
            carried = self._carried.get(t.fd, 0)
            if carried >= WARM:
                self.asked += want
                self.ready += t.pos
            else:
                self._carried[t.fd] = carried + want
            if t.done:
                self._restore(t, idle)
                if t.error is not None:
                    raise ReceiveError(t.pos, t.error)
                return want
            t.lowat = _lowat(want - t.pos)
            if t.lowat > 1:
                _widen(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, t.lowat)
            with self._lock:
                self._transfers[t.fd] = t
                self._epoll.register(t.fd, select.EPOLLIN)
        except ReceiveError:
            raise
        except BaseException:
            self._restore(t, idle)
            raise
        try:
            self._wait(t, idle)
        finally:
            self._restore(t, idle)
        if t.error is not None:
            raise ReceiveError(t.pos, t.error)
        return want

    def _wait(self, t: _Transfer, idle: float | None) -> None:
        deadline = t.deadline
        while True:
            now = time.monotonic()
            bound = _POLL
            if idle is not None:
                bound = min(bound, t.last + idle - now)
            if deadline is not None and deadline.at is not None:
                bound = min(bound, deadline.at - now)
            if bound > 0 and t.event.wait(bound):
                return
            if t.event.is_set():
                return
            now = time.monotonic()
            idle_over = idle is not None and now - t.last >= idle
            total_over = deadline is not None and deadline.expired()
            if idle_over and not total_over and t.lowat > 1:
                # Bytes queued below the low-water mark arrived too: a body slower
                # than the mark fills in ``idle`` is no stall (it was cut as one).
                # Take them (a non-blocking receive ignores the mark).
                before = t.pos
                self._pump(t)
                if t.event.is_set():
                    return
                if t.pos > before:
                    continue
            if idle_over or total_over:
                self._finish(t, TimeoutError("timed out"))
                return

    def _finish(self, t: _Transfer, error: BaseException | None) -> None:
        """End ``t`` (from either thread); after this, nothing writes into its view."""
        with t.lock:
            if t.done:
                return
            t.done = True
            t.error = error
            # The caller's buffers are theirs again: not kept by a finished transfer
            # (the receiving thread holds its last one until the next wake-up).
            t.views = []
        with self._lock:
            if self._transfers.get(t.fd) is t:
                del self._transfers[t.fd]
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(t.fd)
        t.event.set()

    @staticmethod
    def _restore(t: _Transfer, idle: float | None) -> None:
        with contextlib.suppress(OSError):
            if t.lowat != 1:
                t.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
                t.lowat = 1
            t.sock.settimeout(idle)

    # -- the receiving thread ------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                events = self._epoll.poll()
            except OSError:  # pragma: no cover - the epoll was closed (interpreter exit)
                return
            if events:
                self.wakeups += 1
            for fd, _mask in events:
                with self._lock:
                    t = self._transfers.get(fd)
                if t is not None:
                    self._pump(t)

    def _pump(self, t: _Transfer) -> None:
        """Receive what ``t``'s socket has (the TLS layer's buffered bytes too)."""
        error: BaseException | None = None
        finished = False
        with t.lock:
            if t.done:
                return
            want = t.want
            tls = isinstance(t.sock, ssl.SSLSocket)
            for _ in range(_BURST):
                view = t.views[t.index]
                asked = len(view) - t.at
                try:
                    n = t.sock.recv_into(view[t.at:])
                except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                    break
                except ssl.SSLWantWriteError:
                    self._want_write(t, True)
                    break
                except BaseException as exc:  # handed to the caller
                    error, finished = exc, True
                    break
                self.receives += 1
                if t.write:
                    self._want_write(t, False)
                if n == 0:
                    error, finished = EOFError("the peer closed the connection"), True
                    break
                t.pos += n
                t.at += n
                if t.at == len(view) and t.pos < want:
                    t.index, t.at = t.index + 1, 0  # (a full view: the queue may hold more)
                t.last = time.monotonic()
                if t.deadline is not None:
                    t.deadline.progress()
                if t.pos >= want:
                    finished = True
                    break
                lowat = _lowat(want - t.pos)
                if lowat != t.lowat:
                    with contextlib.suppress(OSError):
                        t.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
                    t.lowat = lowat
                if n < asked and not tls:
                    break  # the kernel's queue is empty (a TLS layer gives a record a call)
        if finished:
            self._finish(t, error)

    def _want_write(self, t: _Transfer, on: bool) -> None:
        mask = select.EPOLLIN | (select.EPOLLOUT if on else 0)
        with self._lock, contextlib.suppress(OSError):
            if self._transfers.get(t.fd) is t:
                self._epoll.modify(t.fd, mask)
                t.write = on


_receiver: Receiver | None = None
_receiver_pid = 0
_receiver_lock = threading.Lock()
_local = threading.local()
#: The receiver waits with epoll (Linux); elsewhere nothing shares it.
_EPOLL = hasattr(select, "epoll")
#: Whether threads outside :func:`shared_receiving` share the receiver too
#: (the tests run the blocking data plane's suite both ways).
SHARED_DEFAULT = False


def _after_fork_in_child() -> None:
    global _receiver_lock
    _receiver_lock = threading.Lock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def arrivals() -> tuple[int, int]:
    """(:attr:`Receiver.asked`, :attr:`Receiver.ready`) of the process's
    receiver; (0, 0) before it starts (asking never starts it)."""
    r = _receiver
    if r is None or _receiver_pid != os.getpid():
        return 0, 0
    return r.asked, r.ready


def receiver() -> Receiver:
    """The process's receiver (started on first use; a forked child gets its own)."""
    global _receiver, _receiver_pid
    with _receiver_lock:
        if _receiver is None or _receiver_pid != os.getpid():
            if _receiver is not None:  # the parent's: its thread did not survive the fork
                with contextlib.suppress(OSError):
                    _receiver._epoll.close()
            _receiver = Receiver()
            _receiver_pid = os.getpid()
        return _receiver


@contextlib.contextmanager
def shared_receiving() -> Iterator[None]:
    """Bodies read by this thread inside the block are received by the
    process's :class:`Receiver` (for threads that keep many requests in
    flight: the read-ahead engine's, a copy's parts). Outside, a body is
    received by the reading thread itself (cheapest for one stream whose
    reader is the limit)."""
    before = getattr(_local, "on", None)
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


def shares_receiving() -> bool:
    """Whether this thread is inside :func:`shared_receiving` on a platform with epoll
    (without it, macOS and the BSDs, every body is received by its own reading thread)."""
    if not _EPOLL:
        return False
    on = getattr(_local, "on", None)
    return SHARED_DEFAULT if on is None else bool(on)
