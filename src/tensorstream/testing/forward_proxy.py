"""A real HTTP forward proxy on loopback, for tests of proxy support.

It runs in its **own thread and event loop** on ``127.0.0.1`` and a free port,
and does what squid or tinyproxy do for a client:

* ``CONNECT host:port`` opens a TCP tunnel (https targets: TLS to the origin
  inside it, the proxy sees only ciphertext);
* a request in absolute form (``GET http://host:port/path``) is forwarded to the
  origin in origin form, keep-alive on both sides;
* with ``user``/``password`` set, a request without the right
  ``Proxy-Authorization: Basic`` is answered ``407``; ``refuse_connect`` answers
  every ``CONNECT`` with that status.

Every request it took is in :attr:`ForwardProxy.log`::

    with ForwardProxy(user="u", password="pw") as proxy:
        tensorstream.open(url, "rb", proxy=proxy.url_with("u", "pw")).read()
        assert proxy.log[0].method == "CONNECT"

A test server, not tensorstream's code path: it parses just enough HTTP/1.1
(``Content-Length`` and chunked bodies, bodiless answers) for the clients
tensorstream drives (its data plane, botocore/urllib3, aiohttp).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import threading
from urllib.parse import urlsplit

from .loop_thread import _StreamServer

__all__ = ["ForwardProxy", "ProxyLogEntry"]

_CHUNK = 64 << 10


@dataclasses.dataclass(frozen=True)
class ProxyLogEntry:
    """One request the proxy took: ``CONNECT host:port`` or a forwarded one."""

    method: str
    #: ``host:port`` of a CONNECT, the absolute URL of a forwarded request.
    target: str
    #: The status the proxy itself answered (200 for a tunnel), or the origin's.
    status: int
    #: Whether the request carried a ``Proxy-Authorization`` header.
    authorized: bool
    #: Client connection number (the same for requests on one kept-alive connection).
    connection: int


class ForwardProxy(_StreamServer):
    """An HTTP proxy on ``127.0.0.1`` (free port): CONNECT tunnels and forwarding."""

    _thread_name = "tensorstream-forward-proxy"

    def __init__(self, *, user: str | None = None, password: str | None = None) -> None:
        super().__init__()
        self.user = user
        self.password = password
        #: Answer every CONNECT with this status (e.g. 403, 502) instead of tunnelling.
        self.refuse_connect: int | None = None
        self.log: list[ProxyLogEntry] = []
        self.connections = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ForwardProxy(127.0.0.1:{self.port})"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no credentials)."""
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        """The proxy URL carrying ``user:password``."""
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    # -- serving -------------------------------------------------------------------
    def _note(self, entry: ProxyLogEntry) -> None:
        with self._lock:
            self.log.append(entry)

    def _authorized(self, headers: dict[str, str]) -> bool:
        if self.user is None:
            return True
        want = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
        return headers.get("proxy-authorization", "") == f"Basic {want}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
            number = self.connections
        upstreams: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method, target, headers, _ = head
                authorized = "proxy-authorization" in headers
                if not self._authorized(headers):
                    # As squid does: answer at once (a client waiting for 100 Continue
                    # sends no body) and close (a body may follow).
                    self._note(ProxyLogEntry(method, target, 407, authorized, number))
                    writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                 b"Proxy-Authenticate: Basic realm=\"test\"\r\n"
                                 b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                    await writer.drain()
                    return
                if method == "CONNECT":
                    status = self.refuse_connect
                    self._note(ProxyLogEntry(method, target, status or 200, authorized, number))
                    if status is not None:
                        writer.write(f"HTTP/1.1 {status} Refused\r\nContent-Length: 0\r\n"
                                     "Connection: close\r\n\r\n".encode())
                        await writer.drain()
                        return
                    await self._tunnel(target, reader, writer)
                    return
                if not await self._forward(method, target, headers, reader, writer, upstreams,
                                           number, authorized):
                    return
        except (OSError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            for _, uw in upstreams.values():
                uw.close()
            writer.close()

    async def _tunnel(self, target: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        host, _, port = target.rpartition(":")
        try:
            ureader, uwriter = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        self._writers.add(uwriter)  # aborted at stop, like the client's side
        try:
            # return_exceptions: a pump cancelled at stop leaves no unretrieved error
            await asyncio.gather(_pump(reader, uwriter), _pump(ureader, writer),
                                 return_exceptions=True)
        finally:
            self._writers.discard(uwriter)
            uwriter.close()

    async def _forward(self, method: str, target: str, headers: dict[str, str],
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       upstreams: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]],
                       number: int, authorized: bool) -> bool:
        """Forward one absolute-form request; whether the client connection stays open."""
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return False
        origin = f"{parts.hostname}:{parts.port or 80}"
        if origin not in upstreams:
            upstreams[origin] = await asyncio.open_connection(parts.hostname, parts.port or 80)
        ureader, uwriter = upstreams[origin]
        path = parts.path or "/"
        if parts.query:
            path += f"?{parts.query}"
        lines = [f"{method} {path} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in headers.items()
                  if name not in ("proxy-authorization", "proxy-connection")]
        uwriter.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await uwriter.drain()
        if headers.get("expect", "").lower() == "100-continue":
            answer = await _read_head(ureader)  # the body only after the origin's 100
            if answer is None:
                raise OSError("the origin closed the connection")
            if answer[1] != "100":
                writer.write(answer[3])  # a final answer: the client sends no body
                await _drain_body(ureader, answer[2], writer)
                await writer.drain()
                return False
            writer.write(answer[3])
            await writer.drain()
        await _drain_body(reader, headers, uwriter)
        await uwriter.drain()
        answer = await _read_head(ureader)
        while answer is not None and answer[1] == "100":
            answer = await _read_head(ureader)
        if answer is None:
            raise OSError("the origin closed the connection")
        _, status_text, uheaders, raw = answer
        status = int(status_text)
        self._note(ProxyLogEntry(method, target, status, authorized, number))
        writer.write(raw)
        bodiless = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        until_close = not bodiless and ("content-length" not in uheaders
                                        and "chunked" not in uheaders.get("transfer-encoding", ""))
        if until_close:
            await _pump(ureader, writer)
            upstreams.pop(origin)
            return False
        if not bodiless:
            await _drain_body(ureader, uheaders, writer)
        await writer.drain()
        if uheaders.get("connection", "").lower() == "close":
            uwriter.close()
            upstreams.pop(origin)
            return False
        return headers.get("connection", "").lower() != "close"


async def _read_head(reader: asyncio.StreamReader
                     ) -> tuple[str, str, dict[str, str], bytes] | None:
    """``(method or version, target or status, lower-cased headers, raw bytes)``, or
    ``None`` at a clean end of the connection."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    first, *rest = raw.decode("latin-1").split("\r\n")
    words = first.split(" ", 2)
    if len(words) < 2:
        raise ValueError(f"bad first line {first!r}")
    headers: dict[str, str] = {}
    for line in rest:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return words[0], words[1], headers, raw


async def _drain_body(reader: asyncio.StreamReader, headers: dict[str, str],
                      out: asyncio.StreamWriter | None) -> None:
    """Copy a message body (Content-Length or chunked, framing included) to ``out``."""
    if "chunked" in headers.get("transfer-encoding", ""):
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip(), 16)
            data = await reader.readexactly(size + 2)
            if out is not None:
                out.write(line + data)
            if size == 0:
                return
    left = int(headers.get("content-length", "0") or 0)
    while left:
        data = await reader.read(min(left, _CHUNK))
        if not data:
            raise OSError("body ended early")
        left -= len(data)
        if out is not None:
            out.write(data)
            await out.drain()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
