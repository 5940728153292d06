"""The body of one ranged GET (:class:`RangeBody`), read in order into successive
buffers, each filled whole or raising tensorstream errors; received by the calling
thread or by the process's receiving thread (:mod:`.receiver`)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Callable, Sequence

from ...errors import IncompleteReadError, TensorstreamError
from ..base import Deadline, Pin, current_deadline
from .body_socket import (
    FILE_BUFFER,
    LOWAT,
    SOCKET_FILE_BUFFER,
    BodySocket,
    bytes_queued,
    tls_reader,
)
from .connections import ConnectionPool
from .exchange import OriginKey, total_deadline_error
from .headers import (
    exception_error,
    note_served,
    redact_path,
)
from .receiver import ReceiveError, receiver, shares_receiving
from .throttle import Slot

__all__ = ["RangeBody"]

#: Bytes per ``readinto`` call on chunked bodies: bounds what an error
#: mid-slice forgets (resume restarts at the slice start).
_SLICE = 1 << 20
#: A TLS body is read from its TLS object directly once one ``readinto1`` of more
#: than this was made: the buffered file (far smaller) is empty then.
_TLS_DIRECT_AFTER = 256 << 10


class RangeBody(BodySocket):
    """The body of one ranged GET, read in order into caller buffers.

    From :func:`open_range`. Each :meth:`readinto` fills its whole buffer or
    raises (``received`` on the error counts the bytes of *that* call that are
    valid). Reading to the end returns the connection to the pool;
    :meth:`close` before that closes it (never reused with unread bytes).
    """

    def __init__(self, pool: ConnectionPool, key: OriginKey, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse, *, start: int, end: int, served: Pin | None,
                 service: str, path: str, idle: float | None = None,
                 confirm: Callable[[], None] | None = None, slot: Slot | None = None) -> None:
        self.position = start
        self.end = end
        #: The version the answer reported (ETag, Last-Modified, total size).
        self.served = served
        self.etag = served.etag if served is not None else None
        self._idle = idle
        # Called after each read when the answer carried no validator of its own.
        self._confirm = confirm
        self._pool = pool
        self._key = key
        self._conn: http.client.HTTPConnection | None = conn
        self._resp = resp
        self._service = service
        self._path = path
        # A Content-Length body (checked equal to the range) is read with
        # readinto1: one recv_into per call straight into the buffer, so a cut
        # or a timeout leaves an exact count. Chunked bodies go through
        # http.client's parser in slices (a cut forgets at most one slice).
        self._direct = not resp.chunked and resp.headers.get("Content-Length") is not None
        self._lowat = 1  # the socket's SO_RCVLOWAT (1: the kernel's default)
        # Where the body is known to have arrived up to (in the socket file's buffer
        # or the socket), from the last FIONREAD: held reads inside it ask no more.
        self._arrived = start
        # A close from another thread while a read runs shuts the socket down
        # (the read ends at once, with an error) and the reading thread closes
        # it: closing it under the read would free its descriptor for reuse.
        self._state = threading.Lock()
        self._reading = False
        self._reader = 0  # the reading thread's ident
        self._close_asked = False
        # The request's place in its origin's gate: held until the body is read or dropped.
        self._slot = slot
        # A TLS body's reads, once the socket file holds none of it (tls_reader).
        self._tls_read: Callable[[int, memoryview], int] | None = None
        self._status = resp.status

    def readinto(self, buffer: memoryview) -> int:
        """Fill ``buffer`` with the next ``len(buffer)`` bytes of the body."""
        return self._read([buffer])

    def readinto_parts(self, buffers: Sequence[memoryview]) -> int:
        """Fill each of ``buffers`` in turn with the next bytes of the body (a
        body spanning several destinations: one receive, one hand-off to the
        shared receiver); on an error, ``received`` counts the valid bytes
        from the first buffer's start."""
        return self._read(list(buffers))

    def _claim(self, *, unless_reading: bool = False) -> bool:
        """Mark this thread as reading (see :meth:`close`); ``False``: the body is
        closed or closing (or, ``unless_reading``, another read runs)."""
        with self._state:
            if self._conn is None or self._close_asked or (unless_reading and self._reading):
                return False
            self._reading, self._reader = True, threading.get_ident()
            return True

    def _release(self) -> None:
        """End a read; a close asked for meanwhile by another thread is done now."""
        with self._state:
            self._reading = False
            closing = self._close_asked
        if closing:
            self.close()

    def _read(self, buffers: list[memoryview]) -> int:
        if not self._claim():
            raise ValueError("read from a closed or finished range body")
        try:
            return self._read_body(buffers)
        finally:
            self._release()

    def _read_body(self, buffers: list[memoryview]) -> int:
        want = sum(len(b) for b in buffers)
        if want > self.end - self.position:
            raise ValueError(f"{want} bytes asked, {self.end - self.position} left in the range")
        received = 0
        resp = self._resp
        deadline = current_deadline()
        timed = deadline is not None and deadline.at is not None
        try:
            # (A response that closes its connection has handed the socket to its
            # file object alone: its thread receives it, as before.)
            conn = self._conn
            if self._direct and shares_receiving() and conn is not None and conn.sock is not None:
                if timed:
                    assert deadline is not None
                    self._bound(deadline, received)
                try:
                    received = self._receive_shared(buffers, want, deadline)
                except ReceiveError as exc:
                    received = exc.received
                    if not isinstance(exc.error, EOFError):
                        raise exc.error from None  # mapped below, as from recv_into
                if received < want:
                    raise self._ended(received, want)
            index = at = 0  # the buffer being filled, and where in it
            tls = self._tls_read
            while received < want:
                buffer = buffers[index]
                if at == len(buffer):
                    index, at = index + 1, 0
                    continue
                if timed:
                    assert deadline is not None
                    self._bound(deadline, received)
                if self._direct:
                    # The file object (or the TLS object: one record) may hold up to
                    # a buffer of the body already: the socket owes at least the
                    # rest, never ask it for more (nor keep a mark from a larger read).
                    self._set_lowat(max(1, min(LOWAT, want - received - FILE_BUFFER)))
                if tls is not None:
                    # One TLS record (16 KiB at most) per call: the socket file's
                    # three Python layers above this cost more than the decryption.
                    n = self._read_record(tls, len(buffer) - at, buffer[at:], deadline)
                elif self._direct:
                    asked = len(buffer) - at
                    self._await_arrivals()
                    n = resp.fp.readinto1(buffer[at:])
                    if asked > _TLS_DIRECT_AFTER and conn is not None:
                        tls = self._tls_read = tls_reader(conn, resp)
                else:
                    n = resp.readinto(buffer[at : at + min(_SLICE, len(buffer) - at)])
                if not n:
                    raise self._ended(received, want)
                received += n
                at += n
                if deadline is not None:
                    deadline.progress()  # an async caller's idle watchdog sees it
        except TensorstreamError as exc:
            self.close()
            note_served(exc, self.served)
            raise
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if isinstance(exc, http.client.IncompleteRead) and not self._direct:
                # The chunks of this slice that arrived whole are in the buffer.
                received += len(exc.partial)
            err: TensorstreamError
            if timed and deadline is not None and deadline.expired():
                err = total_deadline_error(received, service=self._service, path=self._path)
            else:
                err = exception_error(exc, path=self._path, received=received,
                                      service=self._service)
            raise note_served(err, self.served) from exc
        except BaseException:
            self.close()
            raise
        self.position += want
        if self.position == self.end:
            self._finish()
        if self._confirm is not None:
            self._confirm()  # raises ObjectChangedError: the bytes are never returned
        return want

    def _receive_shared(self, buffers: list[memoryview], want: int,
                        deadline: Deadline | None) -> int:
        """Receive ``buffers`` whole, in turn, on the process's
        :class:`.receiver.Receiver`: first what ``http.client``'s file object
        already holds of the body, then the rest straight from the socket
        (raises :class:`ReceiveError`, counting from the first buffer)."""
        conn = self._conn
        assert conn is not None and conn.sock is not None
        sock, fp = conn.sock, self._resp.fp
        timeout = sock.gettimeout()
        sock.settimeout(0.0)  # look at what is buffered, never wait for more
        try:
            held = len(fp.peek(want))
        except (BlockingIOError, ssl.SSLWantReadError):
            held = 0
        finally:
            sock.settimeout(timeout)
        got, rest = 0, []
        for buffer in buffers:
            take = min(held - got, len(buffer))
            n = fp.readinto(buffer[:take]) if take > 0 else 0
            if n != max(take, 0):  # (never: those bytes were in its buffer)
                raise ReceiveError(got + n, OSError("the buffered body ended early"))
            got += n
            if n < len(buffer):
                rest.append(buffer[n:])
        if rest:
            try:
                got += receiver().receive(sock, rest, deadline=deadline)
            except ReceiveError as exc:
                raise ReceiveError(got + exc.received, exc.error) from None
        return got

    def _ended(self, received: int, want: int) -> IncompleteReadError:
        """The error for a body that ended early (shared and own receiving alike)."""
        return IncompleteReadError(f"body ended after {received} of {want} bytes",
                                   received=received, service=self._service,
                                   path=redact_path(self._path))

    def _bound(self, deadline: Deadline, received: int) -> None:
        """Check the total deadline between receives and bound the next one by it."""
        if deadline.expired():
            raise total_deadline_error(received, service=self._service, path=self._path)
        conn = self._conn
        if conn is not None and conn.sock is not None:
            conn.sock.settimeout(deadline.wait_bound())

    def _leave(self) -> None:
        if self._slot is not None:
            self._slot.leave(self._status)

    def __del__(self) -> None:
        # A body dropped unread and unclosed must not hold its origin's slot for ever.
        slot = getattr(self, "_slot", None)
        if slot is not None:
            slot.leave(None)

    def _finish(self) -> None:
        self._leave()
        self._set_lowat(1)  # the next request's status line must not wait for the mark
        conn, self._conn = self._conn, None
        assert conn is not None
        if conn.sock is not None and current_deadline() is not None:
            conn.sock.settimeout(self._idle)  # a pooled connection waits by the idle rule
        if self._direct:
            self._resp.close()  # the whole body was read: the socket stays reusable
        if self._resp.isclosed() and not self._resp.will_close:
            self._pool.release(self._key, conn)
        else:  # unread bytes (e.g. a chunked trailer) or Connection: close
            conn.close()

    def read_held(self, buffer: memoryview) -> bool:
        """Fill ``buffer`` with the next bytes of the body if they have all
        arrived (in the file object's buffer or the socket's), else do nothing
        and return ``False``: a reader's small reads (tensor headers) then cost
        one ``ioctl`` and a copy, without the deadline and receiver machinery of
        :meth:`readinto`. Never waits: the socket holds at least the bytes asked
        and its low-water mark, so every receive returns at once. Plain sockets
        only (TLS: queued bytes are not plaintext bytes); bodies confirmed after
        each read take :meth:`readinto`."""
        if not self._claim(unless_reading=True):
            return False
        try:
            return self._read_held(buffer)
        finally:
            self._release()

    def _read_held(self, buffer: memoryview) -> bool:
        want = len(buffer)
        sock = self._holding_socket()
        if sock is None or want > self.end - self.position:
            return False
        # The socket file serves what it holds, then receives the rest; a socket with
        # a timeout polls first, and poll waits for the low-water mark whatever the
        # receive asks for. With this many bytes queued nothing waits.
        need = max(want, self._lowat)
        # Bytes known to have arrived stay arrived (in the socket, or taken by the
        # socket file: at most its buffer): one FIONREAD serves the next reads.
        if self._arrived - self.position < need + SOCKET_FILE_BUFFER:
            queued = bytes_queued(sock)
            if queued is None or queued < need:
                return False
            self._arrived = max(self._arrived, self.position + queued)
        try:
            n = self._resp.fp.readinto(buffer)
        except BaseException:
            self.close()
            raise
        if n != want:  # (never: those bytes had arrived)
            self.close()
            raise self._ended(n, want)
        self.position += want
        if self.position == self.end:
            self._finish()
        return True

    def close(self) -> None:
        """Drop the rest of the body (the connection is closed, not reused).
        Called by another thread while a read runs, the read ends with an error
        and its thread closes the connection."""
        with self._state:
            if self._reading and self._reader != threading.get_ident():
                self._close_asked = True
                sock = self._conn.sock if self._conn is not None else None
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return
            conn, self._conn = self._conn, None
        self._leave()
        if conn is not None:
            conn.close()
