"""What the socket under a ranged GET's body holds, and when a receive on it wakes
(:class:`BodySocket`, the base of :class:`.body.RangeBody`): the bytes queued
(``FIONREAD``), the low-water mark (``SO_RCVLOWAT``) that wakes a reading thread once per
256 KiB rather than per packet burst, arrivals below that mark told from a stall, a TLS
body's records read from its TLS object, and the held bytes a small read takes without
waiting."""

from __future__ import annotations

import fcntl
import http.client
import io
import math
import select
import socket
import ssl
import struct
import termios
from collections.abc import Callable

from ..base import Deadline

__all__ = ["FILE_BUFFER", "LOWAT", "SOCKET_FILE_BUFFER", "BodySocket", "bytes_queued", "tls_reader"]

#: A Content-Length body is received with the socket's low-water mark
#: (``SO_RCVLOWAT``) at up to this many bytes: a slow or paced connection then
#: wakes its thread once per this much instead of once per packet burst
#: (thousands of times a second, each taking the GIL), which is what starves
#: a reader with dozens of connections in flight.
LOWAT = 256 << 10
#: What ``http.client``'s buffered socket file (or a TLS object: one record)
#: may hold of a body beyond what the socket still has to receive.
FILE_BUFFER = 64 << 10
#: The buffer of ``http.client``'s socket file (``socket.makefile``'s default).
SOCKET_FILE_BUFFER = io.DEFAULT_BUFFER_SIZE
#: :meth:`BodySocket.held` asks the socket again when fewer bytes than this are
#: known to have arrived (a small-read buffer's fill, :data:`tensorstream.file.SMALL_FILL`).
HELD_ASK = 256 << 10


def bytes_queued(sock: socket.socket) -> int | None:
    """Bytes waiting in ``sock``'s receive queue (``FIONREAD``), or None if it cannot tell."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])
    except (OSError, ValueError):
        return None


def tls_reader(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
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


class BodySocket:
    """The socket side of a body: its counts and waits (see the module's docstring).
    :class:`.body.RangeBody` sets these attributes and reads the body."""

    position: int
    end: int
    _conn: http.client.HTTPConnection | None
    _resp: http.client.HTTPResponse
    # A Content-Length body, read with readinto1 (RangeBody's __init__).
    _direct: bool
    _confirm: Callable[[], None] | None
    _lowat: int  # the socket's SO_RCVLOWAT (1: the kernel's default)
    # Where the body is known to have arrived up to, from the last FIONREAD.
    _arrived: int

    def _read_record(self, tls: Callable[[int, memoryview], int], size: int, view: memoryview,
                     deadline: Deadline | None) -> int:
        """``tls(size, view)``, with bytes that arrived below the low-water mark
        taken as arrivals (see :meth:`_await_arrivals`): a TLS object, unlike the
        socket file, can be read again after its wait timed out, so the check is
        made only then (nothing is added to the fast path, a call per record)."""
        seen = 0
        while True:
            try:
                return tls(size, view)
            except TimeoutError:
                conn = self._conn
                sock = conn.sock if conn is not None else None
                if sock is None or (self._lowat <= 1 and not seen) or (
                        deadline is not None and deadline.expired()):
                    raise
                queued = bytes_queued(sock)
                if not queued or queued == seen:
                    raise  # nothing came for the idle bound
                seen = queued
                self._set_lowat(1)

    def _await_arrivals(self) -> None:
        """Wait for the low-water mark as the receive would, but treat bytes that
        arrived below it as arrivals: past the idle bound, queued bytes drop the mark
        to 1 (the receive takes them), none is the stall (``TimeoutError``).

        The receive's own wait (``poll`` honours ``SO_RCVLOWAT``) took a body slower
        than the mark fills in ``timeout_idle`` for a stall, and its timeout leaves
        the socket file unusable, so the check is made before it."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if self._lowat <= 1 or sock is None:
            return
        bound = sock.gettimeout()
        if bound is None or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            return
        waiter = select.poll()
        waiter.register(sock, select.POLLIN)
        if waiter.poll(max(1, math.ceil(bound * 1000))):
            return  # the mark is reached, or the peer closed or failed
        if not bytes_queued(sock):
            raise TimeoutError("timed out")  # nothing arrived for the idle bound
        self._set_lowat(1)

    def _set_lowat(self, nbytes: int) -> None:
        # Never above what this call still wants: poll() waits for the mark.
        if nbytes != self._lowat and self._conn is not None and self._conn.sock is not None:
            try:
                self._conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
                self._lowat = nbytes
            except OSError:  # pragma: no cover - a platform without it
                self._lowat = nbytes

    def held(self) -> int:
        """Bytes of the body :meth:`read_held` could serve now, as far as the socket
        tells (0: none, or a body it never serves: TLS, confirmed after each read)."""
        sock = self._holding_socket()
        if sock is None:
            return 0
        if self._arrived - self.position < HELD_ASK + SOCKET_FILE_BUFFER:
            queued = bytes_queued(sock)
            if queued is None:
                return 0
            self._arrived = max(self._arrived, self.position + queued)
        # What _read_held serves without asking the socket again: the socket file may
        # hold part of what arrived, and the socket must hold its low-water mark.
        have = min(self._arrived, self.end) - self.position - SOCKET_FILE_BUFFER
        return have if have >= self._lowat else 0

    def available(self) -> int:
        """Bytes of the body that have arrived and wait in the socket (0 when
        unknown): the read-ahead engine tells from it whether its reader waits
        for the link or the link for its reader."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        queued = bytes_queued(sock) if sock is not None else None
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
