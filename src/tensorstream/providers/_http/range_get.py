"""The one HTTP(S) data plane of tensorstream: every request of the HTTP and S3
providers' reads (ranged GETs, HEADs) goes through here, on ``http.client``
in the calling thread; the providers' async methods are derived from it
(:func:`in_thread`).

Why blocking: ``HTTPResponse.readinto`` fills slices of the destination
``memoryview`` with ``socket.recv_into``, which releases the GIL, so many
threads receive truly in parallel and each byte is written once, straight
into the caller's memory. Measured against aiohttp (event loop, one Python
callback per chunk, a copy out of its buffers) this plane is the fast one:
see ``docs/benchmarks.md``.

* :class:`ConnectionPool` (in :mod:`.connections`, with the TLS settings,
  redirect rules and :class:`Cancel`): thread-safe keep-alive pool keyed by
  ``(scheme, host, port)`` (one pool per TLS setting: a provider owns one).
  Only a connection whose response was read to its end, and that the server
  keeps open, goes back; any error, partial body or interruption closes it, so
  a reused connection can never yield the previous response's bytes. The pool
  forgets connections inherited across ``fork``.
* :func:`open_range`: one ranged GET (following redirects by a given policy),
  its answer checked by :func:`.headers.check_ranged_response` (status,
  ``Content-Range`` with total, ``Content-Length``, ``Content-Encoding``,
  ETag); its :class:`RangeBody` is read in order into successive buffers,
  each filled whole or raising tensorstream errors (a ranged read into one
  buffer is one :func:`open_range` read whole).
* :func:`request`: a small request (``HEAD``, a one-byte probe) under the
  same redirect rules.
* :func:`in_thread` (in :mod:`.threads`): the async side, on worker threads,
  cancellable.

A thread that keeps many requests in flight (the read-ahead engine's) asks
for :func:`.receiver.shared_receiving`: its bodies are then received by the
process's one receiving thread (epoll over every such connection, each
``recv_into`` straight into the destination) instead of by itself, so tens
of connections do not take turns at the GIL; the semantics below are the same.

Deadlines: each receive is bounded by a socket timeout (``timeout_idle``, cut
to what is left of ``timeout_total``), and the total deadline of the running
operation (:func:`~tensorstream.providers.base.current_deadline`) is checked
between receives, so a server trickling a byte at a time cannot hold a read
past it.

No retries here: :mod:`tensorstream.layers.stack` retries and resumes. The only
repeat is urllib3's classic one: a *reused* keep-alive connection that the
server closed while idle (or that held bytes its last answer left) is replaced
by a new one, once, before any byte of the answer arrived.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import http.client
import io
import socket
import ssl
import struct
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from yarl import URL

from ...config import Timeouts
from ...errors import (
    ConfigurationError,
    IncompleteReadError,
    InvalidRangeError,
    ProtocolError,
    ServiceUnavailableError,
    StorageTimeoutError,
    TensorstreamError,
)
from ..base import Deadline, Pin, current_deadline
from .connections import (
    Cancel,
    Cancelled,
    ConnectionPool,
    ForwardingConnection,
    ProxyRefused,
    RedirectPolicy,
    TLSSettings,
    current,
)
from .headers import (
    CREDENTIALS_DROPPED,
    LIST_HEADERS,
    REDIRECT_STATUSES,
    body_refusal,
    check_ranged_response,
    conditional_headers,
    exception_error,
    is_metadata_address,
    needs_confirmation,
    note_served,
    parse_content_range,
    redact_path,
    redirect_step,
    refuse_metadata_target,
    served_version,
    status_error,
)
from .receiver import ReceiveError, receiver, shares_receiving
from .threads import in_thread  # re-exported: the async side lives there
from .throttle import Slot, gate

__all__ = [
    "Answer", "Cancel", "Cancelled", "ConnectionPool", "RangeBody", "RedirectPolicy", "TLSSettings",
    "in_thread", "open_range", "open_whole", "request",
]

#: Bytes per ``readinto`` call on chunked bodies: bounds what an error
#: mid-slice forgets (resume restarts at the slice start).
_SLICE = 1 << 20
#: A Content-Length body is received with the socket's low-water mark
#: (``SO_RCVLOWAT``) at up to this many bytes: a slow or paced connection then
#: wakes its thread once per this much instead of once per packet burst
#: (thousands of times a second, each taking the GIL), which is what starves
#: a reader with dozens of connections in flight.
_LOWAT = 256 << 10
#: What ``http.client``'s buffered socket file (or a TLS object: one record)
#: may hold of a body beyond what the socket still has to receive.
_FILE_BUFFER = 64 << 10
#: The buffer of ``http.client``'s socket file (``socket.makefile``'s default).
_SOCKET_FILE_BUFFER = io.DEFAULT_BUFFER_SIZE
#: :meth:`RangeBody.held` asks the socket again when fewer bytes than this are
#: known to have arrived (a small-read buffer's fill, :data:`tensorstream.file.SMALL_FILL`).
_HELD_ASK = 256 << 10
#: A TLS body is read from its TLS object directly once one ``readinto1`` of more
#: than this was made: the buffered file (far smaller) is empty then.
_TLS_DIRECT_AFTER = 256 << 10
#: At most this many bytes of an error body are read (S3 XML errors are small).
_ERROR_BODY_LIMIT = 64 << 10

_Key = tuple[str, str, int]
#: Builds the error for a status other than 200/206 from the open response.
StatusMapper = Callable[[http.client.HTTPResponse, str], TensorstreamError]
#: Reports the object's version now (a HEAD), to confirm an answer that
#: carried no validator of its own.
Confirm = Callable[[], Pin]


def _total_deadline_error(received: int, *, service: str, path: str) -> StorageTimeoutError:
    return Deadline(None, None).error(received, service=service, path=path)


class _HeaderView(dict[str, str]):
    """A response's headers read once into a dict, looked up case-insensitively
    (the first of repeated headers wins, as with ``HTTPMessage.get``, except
    that the codings' lists are joined and differing repeats are noted). Every
    ``HTTPMessage.get`` scans and lower-cases the whole header list: a few
    microseconds each, several per ranged GET, all under the GIL."""

    def __init__(self, message: Any) -> None:
        super().__init__()
        #: Names given twice with different values (see :func:`.headers.body_refusal`).
        self.conflicting: set[str] = set()
        for name, value in message.raw_items():
            key = name.lower()
            if key not in self:
                self[key] = value
            elif key in LIST_HEADERS:  # RFC 9110 5.3: repeats of a list are one list
                self[key] = f"{self[key]}, {value}"
            elif self[key].strip() != value.strip():
                self.conflicting.add(key)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


def _key(url: URL) -> _Key:
    if url.scheme not in ("http", "https") or not url.host:
        raise ProtocolError(f"unsupported URL scheme {url.scheme!r}")
    return (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))


def _default_status(resp: http.client.HTTPResponse, path: str) -> TensorstreamError:
    return status_error(resp.status, resp.reason, resp.headers, path=path)


def read_error_body(resp: http.client.HTTPResponse) -> bytes:
    """At most ``_ERROR_BODY_LIMIT`` bytes of an error answer's body (best effort)."""
    try:
        return resp.read(_ERROR_BODY_LIMIT)
    except (OSError, http.client.HTTPException):
        return b""


def _check_redirect(target: URL, policy: RedirectPolicy, path: str) -> None:
    if policy.allow_private or not target.host:
        return
    addresses = [target.host]
    if not is_metadata_address(target.host):
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            addresses += [str(i[4][0]) for i in infos]
        except OSError:
            pass  # unresolvable: the request itself will fail and say so
    refuse_metadata_target(addresses, path=path)


def _exchange(pool: ConnectionPool, url: URL, method: str, headers: dict[str, str],
              timeouts: Timeouts, *, service: str, path: str, cancel: Cancel | None
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send one request and read the status line and headers (each wait bounded
    by the running operation's deadline, when it has one)."""
    key = _key(url)
    target = url.raw_path_qs or "/"  # sent verbatim: never re-encode a signed URL
    cancel = cancel if cancel is not None else getattr(current, "cancel", None)
    deadline = current_deadline()
    timed = deadline is not None and deadline.at is not None
    for attempt in range(2):
        if timed:
            assert deadline is not None
            if deadline.expired():
                raise _total_deadline_error(0, service=service, path=path)
            left = deadline.remaining() or 0.0
            timeouts = dataclasses.replace(timeouts, connect=max(0.001, min(
                timeouts.connect, left)))
        try:
            # The repeat takes a new connection: the other idle ones were most
            # likely closed by the same server (its keep-alive timeout) as well.
            conn, reused = pool.acquire(key, timeouts, fresh=attempt > 0)
        except TimeoutError as exc:
            if timed and deadline is not None and deadline.expired():
                raise _total_deadline_error(0, service=service, path=path) from exc
            raise StorageTimeoutError(
                f"connect timeout ({timeouts.connect:g} s) to {pool.describe(key)}",
                service=service, path=redact_path(path)) from exc
        except ProxyRefused as exc:
            raise exc.error(service=service, path=redact_path(path)) from None
        try:
            if cancel is not None:
                cancel.attach(conn)
                if cancel.cancelled:
                    raise Cancelled("the caller was cancelled", service=service,
                                    path=redact_path(path))
            if timed and conn.sock is not None:
                assert deadline is not None
                conn.sock.settimeout(deadline.wait_bound())
            conn.request(method, target, headers=headers)
            return conn, conn.getresponse()
        except (http.client.BadStatusLine, ConnectionResetError, BrokenPipeError):
            conn.close()
            if not reused or (cancel is not None and cancel.cancelled):
                raise
            # The server closed this keep-alive connection while it sat idle
            # (RemoteDisconnected is a BadStatusLine), or what came first was no
            # status line: bytes its previous answer left (a CRLF after a body, a
            # body sent with a HEAD answer).
        except (UnicodeEncodeError, ValueError) as exc:
            conn.close()
            if isinstance(exc, UnicodeEncodeError) or str(exc).startswith("Invalid header"):
                # http.client's error holds the whole header value: a token, a key id
                # (from a source resolved without this check, e.g. botocore's chain)
                raise ConfigurationError(
                    "a request header value cannot be sent (a line break, or a character "
                    "beyond Latin-1): check the credentials; the value is not shown",
                    service=service, path=redact_path(path)) from None
            raise
        except BaseException:
            conn.close()
            raise
    raise AssertionError("unreachable")


@dataclasses.dataclass
class Answer:
    """A final (non-redirect) answer's status line and headers; its body was
    read (at most ``_ERROR_BODY_LIMIT`` bytes) and its connection released."""

    status: int
    reason: str
    headers: _HeaderView
    body: bytes
    #: The body was read to its end (not cut at the request's ``body_limit``).
    complete: bool = True


def _send(pool: ConnectionPool, url: str, method: str, headers: Mapping[str, str],
          timeouts: Timeouts, *, service: str, path: str, redirects: RedirectPolicy | None,
          cancel: Cancel | None
          ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, _HeaderView, URL]:
    """One request, following redirects by ``redirects``' rules (without, a
    redirect is an answer like any other); returns the final answer."""
    current = URL(url, encoded=True)
    creds = dict(redirects.credentials) if redirects is not None else {}
    hops = redirects.max_redirects if redirects is not None else 0
    dropped = False  # credentials were dropped at a hop to another origin
    for _ in range(hops + 1):
        conn, resp = _exchange(pool, current, method, {**headers, **creds}, timeouts,
                               service=service, path=path, cancel=cancel)
        try:
            if resp.status == 407 and isinstance(conn, ForwardingConnection):
                # The proxy's answer, not the origin's: say so, never retry it as one.
                _, host, port = _key(current)
                raise ProxyRefused.refusal(conn.proxy, host, port, 407, resp.reason,
                                           what="the request").error(
                    service=service, path=redact_path(path))
            view = _HeaderView(resp.headers)
            location = view.get("Location")
            if redirects is not None and resp.status in REDIRECT_STATUSES and location:
                conn.close()  # never drain a body we do not want
                target, same_origin = redirect_step(current, location, path=path)
                if not same_origin:
                    dropped = dropped or bool(creds)
                    creds = {}  # never forward credentials to another origin (or to http)
                _check_redirect(target, redirects, path)
                current = target
                continue
        except BaseException:
            conn.close()  # never reuse a connection after an error
            raise
        if dropped and resp.status in (401, 403):
            # A refusal's error must not say the credentials were sent (both header
            # objects: the status is mapped from either, see status_error).
            for message in (view, resp.headers):
                setattr(message, CREDENTIALS_DROPPED, True)
        return conn, resp, view, current
    raise ProtocolError(f"more than {hops} redirects", service=service,
                        path=redact_path(path))


def _queued(sock: socket.socket) -> int | None:
    """Bytes waiting in ``sock``'s receive queue (``FIONREAD``), or None if it cannot tell."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])
    except (OSError, ValueError):
        return None


def _tls_reader(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
                ) -> Callable[[int, memoryview], int] | None:
    """The TLS object's own ``read(n, buffer)`` for a direct body of a TLS
    connection whose socket file holds no byte of it (after a ``readinto1`` larger
    than its buffer), else ``None`` (plain sockets, or an ``ssl`` module without
    it: the socket file is read as before)."""
    sock = conn.sock
    if not isinstance(sock, ssl.SSLSocket) or type(resp.fp) is not io.BufferedReader:
        return None
    read = getattr(getattr(sock, "_sslobj", None), "read", None)
    return read if callable(read) else None


def _enter(url: URL, *, service: str, path: str, cancel: Cancel | None) -> Slot:
    """A slot in the origin's :class:`~.throttle.Gate` (waits while it is full)."""
    deadline = current_deadline()
    cancel = cancel if cancel is not None else getattr(current, "cancel", None)
    slot = gate(_key(url)).enter(
        deadline.at if deadline is not None else None,
        (lambda: cancel.cancelled) if cancel is not None else None)
    if slot is None:
        if cancel is not None and cancel.cancelled:
            raise Cancelled("the caller was cancelled", service=service, path=redact_path(path))
        raise _total_deadline_error(0, service=service, path=path)
    return slot


def _adapting(exc: TensorstreamError, url: URL) -> TensorstreamError:
    """Mark a throttle while other requests to the origin are in flight (the
    caller still holds its slot): the width is adapting (:mod:`.throttle`), so
    the retry layer is more patient with it."""
    if isinstance(exc, ServiceUnavailableError) and gate(_key(url)).shared():
        exc.adapting = True
    return exc


def request(pool: ConnectionPool, url: str, method: str, headers: Mapping[str, str],
            timeouts: Timeouts, *, path: str, service: str = "http",
            redirects: RedirectPolicy | None = None, cancel: Cancel | None = None,
            body_limit: int = _ERROR_BODY_LIMIT) -> Answer:
    """A small request (``HEAD``, a one-byte probe, a listing): the whole answer,
    its body capped at ``body_limit`` bytes; the connection is reused when the
    body was read to its end."""
    slot = _enter(URL(url, encoded=True), service=service, path=path, cancel=cancel)
    status: int | None = None
    try:
        conn, resp, view, final = _send(pool, url, method, headers, timeouts, service=service,
                                        path=path, redirects=redirects, cancel=cancel)
        try:
            body = resp.read(body_limit)
        except BaseException:
            conn.close()
            raise
        status = resp.status
        complete = resp.isclosed()
        if complete and not resp.will_close:
            pool.release(_key(final), conn)
        else:
            conn.close()
        return Answer(resp.status, resp.reason, view, body, complete)
    except TensorstreamError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise exception_error(exc, path=path, received=0, service=service) from exc
    finally:
        slot.leave(status)


class RangeBody:
    """The body of one ranged GET, read in order into caller buffers.

    From :func:`open_range`. Each :meth:`readinto` fills its whole buffer or
    raises (``received`` on the error counts the bytes of *that* call that are
    valid). Reading to the end returns the connection to the pool;
    :meth:`close` before that closes it (never reused with unread bytes).
    """

    def __init__(self, pool: ConnectionPool, key: _Key, conn: http.client.HTTPConnection,
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
        # A TLS body's reads, once the socket file holds none of it (_tls_reader).
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
                    self._set_lowat(max(1, min(_LOWAT, want - received - _FILE_BUFFER)))
                if tls is not None:
                    # One TLS record (16 KiB at most) per call: the socket file's
                    # three Python layers above this cost more than the decryption.
                    n = tls(len(buffer) - at, buffer[at:])
                elif self._direct:
                    asked = len(buffer) - at
                    n = resp.fp.readinto1(buffer[at:])
                    if asked > _TLS_DIRECT_AFTER and conn is not None:
                        tls = self._tls_read = _tls_reader(conn, resp)
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
                err = _total_deadline_error(received, service=self._service, path=self._path)
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

    def _set_lowat(self, nbytes: int) -> None:
        # Never above what this call still wants: poll() waits for the mark.
        if nbytes != self._lowat and self._conn is not None and self._conn.sock is not None:
            try:
                self._conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
                self._lowat = nbytes
            except OSError:  # pragma: no cover - a platform without it
                self._lowat = nbytes

    def _bound(self, deadline: Deadline, received: int) -> None:
        """Check the total deadline between receives and bound the next one by it."""
        if deadline.expired():
            raise _total_deadline_error(received, service=self._service, path=self._path)
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
        if self._arrived - self.position < need + _SOCKET_FILE_BUFFER:
            queued = _queued(sock)
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

    def held(self) -> int:
        """Bytes of the body :meth:`read_held` could serve now, as far as the socket
        tells (0: none, or a body it never serves: TLS, confirmed after each read)."""
        sock = self._holding_socket()
        if sock is None:
            return 0
        if self._arrived - self.position < _HELD_ASK + _SOCKET_FILE_BUFFER:
            queued = _queued(sock)
            if queued is None:
                return 0
            self._arrived = max(self._arrived, self.position + queued)
        # What _read_held serves without asking the socket again: the socket file may
        # hold part of what arrived, and the socket must hold its low-water mark.
        have = min(self._arrived, self.end) - self.position - _SOCKET_FILE_BUFFER
        return have if have >= self._lowat else 0

    def available(self) -> int:
        """Bytes of the body that have arrived and wait in the socket (0 when
        unknown): the read-ahead engine tells from it whether its reader waits
        for the link or the link for its reader."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        queued = _queued(sock) if sock is not None else None
        return 0 if queued is None else min(queued, self.end - self.position)

    def _holding_socket(self) -> socket.socket | None:
        """The socket held reads take bytes from, or None where they serve none: a
        TLS body (queued bytes are not plaintext bytes) or one confirmed after each read."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if (sock is None or not self._direct or self._confirm is not None
                or type(sock) is not socket.socket):
            return None
        return sock

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


def open_range(
    pool: ConnectionPool,
    url: str,
    offset: int,
    end: int,
    headers: Mapping[str, str],
    pin: Pin | None,
    timeouts: Timeouts,
    *,
    path: str | None = None,
    service: str = "http",
    redirects: RedirectPolicy | None = None,
    on_status: StatusMapper | None = None,
    cancel: Cancel | None = None,
    confirm: Confirm | None = None,
) -> RangeBody:
    """Send a GET for bytes ``[offset, end)`` of ``url`` and check its answer;
    the body is then read with :meth:`RangeBody.readinto`.

    ``headers`` are sent as given (``Accept-Encoding: identity`` and ``Range``
    are added, and the validators of ``pin``: ``If-Match`` with a strong ETag,
    else ``If-Unmodified-Since``). The answer must report the pinned size and
    version (:func:`.headers.check_ranged_response`); one that reports no
    validator at all is confirmed after each read by ``confirm()`` (a HEAD)
    when given, else refused. With ``redirects``,
    its credential headers are sent to the first origin and dropped when a
    redirect leaves it; without, a redirect is mapped like any other status.
    ``path`` names the object in errors (redacted); ``on_status`` maps an
    unexpected status (default: the shared HTTP mapping); ``cancel`` lets
    another thread stop the request and its body.
    """
    where = path if path is not None else (URL(url, encoded=True).raw_path_qs or "/")
    if offset < 0 or end <= offset:
        raise InvalidRangeError(f"invalid range [{offset}, {end})", service=service,
                                path=redact_path(where))
    last = end - 1
    base = {**headers, "Accept-Encoding": "identity", "Range": f"bytes={offset}-{last}",
            **conditional_headers(pin)}
    mapper = on_status or _default_status
    served: Pin | None = None
    origin = URL(url, encoded=True)
    slot: Slot | None = _enter(origin, service=service, path=where, cancel=cancel)
    status: int | None = None
    try:
        conn, resp, view, final = _send(pool, url, "GET", base, timeouts, service=service,
                                        path=where, redirects=redirects, cancel=cancel)
        status = resp.status
        try:
            served = check_ranged_response(resp.status, view, first=offset, last=last,
                                           pin=pin, path=where, service=service,
                                           on_status=lambda r=resp: mapper(r, where))
            after = None
            if pin is not None and needs_confirmation(pin, served):
                after = _confirmation(pin, confirm, service=service, path=where)
            body = RangeBody(pool, _key(final), conn, resp, start=offset, end=end,
                             served=served, service=service, path=where,
                             idle=timeouts.idle, confirm=after, slot=slot)
            slot = None  # the body's now
            return body
        except BaseException:
            conn.close()  # never reuse a connection after an error
            raise
    except TensorstreamError as exc:
        note_served(_adapting(exc, origin), served)
        raise
    except (OSError, http.client.HTTPException) as exc:
        deadline = current_deadline()
        if deadline is not None and deadline.expired():
            raise _total_deadline_error(0, service=service, path=where) from exc
        err = exception_error(exc, path=where, received=0, service=service)
        raise note_served(err, served) from exc
    finally:
        if slot is not None:
            slot.leave(status)


def _confirmation(pin: Pin, confirm: Confirm | None, *, service: str,
                  path: str) -> Callable[[], None]:
    """A check run after each read of an answer that carried no validator."""
    if confirm is None:
        raise ProtocolError("the answer carries neither ETag nor Last-Modified, so it "
                            "cannot be tied to the version being read", service=service,
                            path=redact_path(path))

    def check() -> None:
        pin.check(confirm(), service=service, path=redact_path(path), confirming=True)

    return check


def open_whole(
    pool: ConnectionPool,
    url: str,
    headers: Mapping[str, str],
    timeouts: Timeouts,
    *,
    path: str | None = None,
    service: str = "http",
    redirects: RedirectPolicy | None = None,
    on_status: StatusMapper | None = None,
    cancel: Cancel | None = None,
) -> tuple[_HeaderView, RangeBody] | None:
    """Send a GET for every byte of ``url`` (``Range: bytes=0-``) and return the
    answer's headers with its body (whose ``end`` is the object's size), so one
    round trip gives both what a ``HEAD`` gives and the stream from byte 0.

    Only a clean answer is taken: a 206 of ``bytes 0-(N-1)/N`` with no content
    coding, a ``Content-Length`` (when sent) of the whole size and an ETag (what
    later ranged reads are pinned to; without one the ``HEAD`` may have one, and
    its answer decides the pin, as before). A temporary status (429, 5xx) raises
    its error (``on_status``, default: the shared HTTP mapping), for the caller's
    retry policy. Any other answer (200, 416 for
    an empty object, 404, 403...) returns ``None`` after closing the connection:
    the caller asks as before (``HEAD``, then a probe), which maps every status
    the way it always did. Connection errors raise, mapped as :func:`open_range`'s.
    """
    where = path if path is not None else (URL(url, encoded=True).raw_path_qs or "/")
    base = {**headers, "Accept-Encoding": "identity", "Range": "bytes=0-"}
    origin = URL(url, encoded=True)
    slot: Slot | None = _enter(origin, service=service, path=where, cancel=cancel)
    status: int | None = None
    try:
        try:
            conn, resp, view, final = _send(pool, url, "GET", base, timeouts, service=service,
                                            path=where, redirects=redirects, cancel=cancel)
        except TensorstreamError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            deadline = current_deadline()
            if deadline is not None and deadline.expired():
                raise _total_deadline_error(0, service=service, path=where) from exc
            raise exception_error(exc, path=where, received=0, service=service) from exc
        status = resp.status
        try:
            if resp.status == 429 or resp.status >= 500:  # temporary: retried like a HEAD's
                raise _adapting((on_status or _default_status)(resp, where), origin)
            cr = parse_content_range(view.get("Content-Range"))
            length = view.get("Content-Length")
            served = served_version(view, cr.total if cr is not None else None)
            if (resp.status != 206 or body_refusal(view) is not None or cr is None
                    or cr.total is None or cr.total == 0
                    or (cr.first, cr.last) != (0, cr.total - 1)
                    or (length is not None and length.strip() != str(cr.total))
                    or served.etag is None):
                conn.close()
                return None
            body = RangeBody(pool, _key(final), conn, resp, start=0, end=cr.total,
                             served=served, service=service, path=where, idle=timeouts.idle,
                             slot=slot)
            slot = None  # the body's now
        except BaseException:
            conn.close()  # never reuse a connection after an error
            raise
    finally:
        if slot is not None:
            slot.leave(status)
    return view, body
