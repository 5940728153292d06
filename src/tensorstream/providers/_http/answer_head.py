"""The head of an HTTP answer (status line and headers, ``100 Continue``
heads included), read under the operation's deadline and a size cap.

``http.client`` reads the head through the socket file, each receive bounded
only by the socket's timeout: a server that sends a byte now and then (inside
``timeout_idle``) held ``getresponse()`` past ``timeout_total`` for as long as
it liked, and one that sent ``100 Continue`` heads without end (``http.client``
skips any number of them) held it for ever. :class:`HeadedResponse` reads its
head through :class:`_HeadReader`: before each receive the total deadline is
checked and the socket's timeout cut to what is left of it, and the head may
take at most :data:`HEAD_LIMIT` bytes. Once the head is read the reader steps
aside: the body is received as before (its own receive loop bounds it).
Informational answers other than ``100`` (``103 Early Hints``, ``102
Processing``) are skipped as ``100`` is, under the same bounds: ``http.client``
took them for the final answer.
"""

from __future__ import annotations

import http.client
import io
import socket
from typing import Any

from ..base import Deadline, current_deadline

__all__ = ["HEAD_LIMIT", "HeadedResponse"]

#: The most bytes an answer's head may take, ``100 Continue`` heads included.
#: ``http.client`` itself allows 100 header lines of 64 KiB each per head; real
#: heads are a few KiB.
HEAD_LIMIT = 1 << 20


class _HeadReader(socket.SocketIO):
    """The socket file's raw reader, bounded while the head is read."""

    def __init__(self, sock: socket.socket, deadline: Deadline | None) -> None:
        super().__init__(sock, "rb")
        self._socket = sock
        self._deadline = deadline if deadline is not None and deadline.at is not None else None
        self._left = HEAD_LIMIT
        self.in_head = True

    def readinto(self, b: Any) -> Any:
        if not self.in_head:
            return super().readinto(b)
        if self._left <= 0:
            raise http.client.HTTPException(
                f"the answer's status line and headers ran past {HEAD_LIMIT >> 20} MiB")
        deadline = self._deadline
        if deadline is not None:
            if deadline.expired():
                # An OSError, mapped as a receive timed out at the deadline is.
                raise TimeoutError("the answer's head ran past timeout_total")
            self._socket.settimeout(deadline.wait_bound())
        view = memoryview(b).cast("B")
        n = super().readinto(view[: self._left])
        if n:
            self._left -= n
        return n


class _HeadFile:
    """What :class:`http.client.HTTPResponse` asks its socket for: ``makefile``."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def makefile(self, mode: str) -> io.BufferedReader:
        raw = _HeadReader(self._sock, current_deadline())
        # As socket.makefile does: the socket stays open while its file is (the
        # reader's close gives the reference back).
        self._sock._io_refs += 1  # type: ignore[attr-defined]
        return io.BufferedReader(raw, io.DEFAULT_BUFFER_SIZE)


class HeadedResponse(http.client.HTTPResponse):
    """An ``HTTPResponse`` whose head is read under the running operation's
    total deadline and :data:`HEAD_LIMIT` (set as a connection's
    ``response_class``), informational answers before it skipped."""

    def __init__(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None,
                 url: str | None = None) -> None:
        super().__init__(_HeadFile(sock), debuglevel, method, url)  # type: ignore[arg-type]

    def begin(self) -> None:
        try:
            super().begin()
        finally:
            raw = getattr(self.fp, "raw", None)
            if isinstance(raw, _HeadReader):
                raw.in_head = False

    def _read_status(self) -> tuple[str, int, str]:
        # RFC 9110 15.2: a client must parse any number of 1xx answers before the
        # final one and may ignore them. http.client skips only "100 Continue":
        # a "103 Early Hints" (CDNs send them) or "102 Processing" was taken for
        # the answer. Their heads count towards HEAD_LIMIT. ("101 Switching
        # Protocols" is an answer: nothing here asks to switch.)
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not (102 <= status < 200):
                return version, status, reason
            _skip_header_lines(self.fp)


def _skip_header_lines(fp: Any) -> None:
    """Read an informational answer's header lines, as ``http.client`` reads
    a final answer's (the same limits on a line and on their number)."""
    for _ in range(http.client._MAXHEADERS + 1):  # type: ignore[attr-defined]
        line = fp.readline(http.client._MAXLINE + 1)  # type: ignore[attr-defined]
        if len(line) > http.client._MAXLINE:  # type: ignore[attr-defined]
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return
    raise http.client.HTTPException(
        f"got more than {http.client._MAXHEADERS} headers")  # type: ignore[attr-defined]
