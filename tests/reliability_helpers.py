"""Helpers for the reliability suite (``tests/reliability/test_reliability_*.py``).

Canary secrets, a listener that never accepts, a child-process runner, an
S3 proxy that answers ``CompleteMultipartUpload`` with ``200`` + ``<Error>``,
a log handler that runs a callback when the retry layer logs an attempt, and a
file size limit that fails writes as a full disk does.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from tensorstream.testing.proxy import HTTPFaultProxy, TCPFaultProxy

#: Distinct canaries per channel, so a failure says which channel leaked.
CANARY_ARG = "cnry-arg-7d1f0b2e9a"
CANARY_ENV = "cnry-env-4c8e2a61f3"
CANARY_USERINFO = "cnry-uinfo-91b7d3"
CANARY_FILE = "cnry-file-5e02ac7b44"
CANARY_QUERY = "cnry-query-a6f1c90d"
CANARIES = (CANARY_ARG, CANARY_ENV, CANARY_USERINFO, CANARY_FILE, CANARY_QUERY)

#: Fast retries, small parts: one read becomes several ranged requests (no
#: streamed reads: those are one request for a whole run of reads).
FAST: dict[str, Any] = {"backoff_initial": 0.01, "backoff_max": 0.05}
SMALL_PARTS: dict[str, Any] = {"part_size": 64 << 10, "concurrency": 4, "readahead": 0,
                               "stream_reads": False, **FAST}
#: SMALL_PARTS with read-ahead on: the rest of an object may be fetched early.
SMALL_PARTS_READAHEAD: dict[str, Any] = {**SMALL_PARTS, "readahead": 256 << 10}
#: Fast retries, one part: a read of a small object is one request.
ONE_PART: dict[str, Any] = {"part_size": 8 << 20, **FAST}


def unique(prefix: str = "obj") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def put_http(server: Any, data: bytes) -> tuple[str, str]:
    """``data`` stored under a new key of ``server`` (an ``HTTPTestServer``): the key
    and its URL."""
    key = unique()
    server.put(key, data)
    return key, server.url(key)


def leaked(text: str, canaries: tuple[str, ...] = CANARIES) -> list[str]:
    """The canaries that appear in ``text`` (empty when nothing leaked)."""
    return [c for c in canaries if c in text]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_fds() -> int:
    return int(psutil.Process().num_fds())


class FullBacklogListener:
    """A TCP listener that never accepts and whose accept queue is full, so a new
    connection's SYN is dropped and ``connect()`` hangs until the client's timeout."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = int(self.sock.getsockname()[1])
        self._fillers: list[socket.socket] = []
        # Fill the accept queue (backlog 0 admits one or two) with non-blocking connects.
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(s)

    def close(self) -> None:
        for s in self._fillers:
            s.close()
        self.sock.close()

    def __enter__(self) -> FullBacklogListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_or_kill(pid: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for the forked child ``pid``, then kill it: whether it ended
    by itself. For scripts that fork (a child that hangs must not hang the test): they
    take it as :data:`WAIT_OR_KILL`."""
    import os
    import time

    deadline = time.monotonic() + seconds
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.05)
    return True


#: :func:`wait_or_kill`'s source, to put in front of a script :func:`run_python` runs.
WAIT_OR_KILL = inspect.getsource(wait_or_kill)


def fork_while_held(locks: list[object], child: object, seconds: float = 20) -> dict[str, object]:
    """Fork while another thread of the program holds every lock in ``locks`` (as a
    load or copy in the background does when ``multiprocessing``, a DataLoader or
    vLLM forks): ``child()``'s dict, run in the forked child, or ``{"error": ...}``
    where it raised, ``{"hung": True}`` where it did not answer in ``seconds``
    (killed then). For scripts run by :func:`run_python`: take it as
    :data:`FORK_WHILE_HELD` (its annotations are builtins: they run there too)."""
    import json
    import os
    import threading

    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread of the program, inside tensorstream at the fork
        for lock in locks:
            lock.acquire()  # type: ignore[attr-defined]
        held.set()
        release.wait()
        for lock in reversed(locks):
            lock.release()  # type: ignore[attr-defined]

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            out = child()  # type: ignore[operator]
        except BaseException as exc:
            out = {"error": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    wait_or_kill(pid, seconds)
    release.set()
    answer = os.read(r, 1 << 16)
    os.close(r)
    return dict(json.loads(answer or b'{"hung": true}'))


#: :func:`fork_while_held`'s source and :data:`WAIT_OR_KILL`, for a script's head.
FORK_WHILE_HELD = WAIT_OR_KILL + "\n\n" + inspect.getsource(fork_while_held)


def run_python(code: str, *, timeout: float = 60, env: dict[str, str] | None = None,
               args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (bounded by ``timeout``)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *(args or [])],
                          capture_output=True, text=True, timeout=timeout, env=full_env)


class OnRetryLog(logging.Handler):
    """Calls ``callback(n)`` when ``tensorstream.layers.stack`` logs its n-th failed attempt."""

    def __init__(self, callback: Callable[[int], None]) -> None:
        super().__init__(logging.DEBUG)
        self.callback = callback
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.callback(len(self.records))

    def __enter__(self) -> OnRetryLog:
        logger = logging.getLogger("tensorstream.layers.stack")
        self._old_level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("tensorstream.layers.stack")
        logger.removeHandler(self)
        logger.setLevel(self._old_level)


_ERROR_200 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
              b"<Message>We encountered an internal error. Please try again.</Message></Error>")


class CompleteErrorProxy(HTTPFaultProxy):
    """An S3 proxy that answers every ``CompleteMultipartUpload`` with ``200`` and an
    ``<Error>`` document (without forwarding it), as S3 may do after a long merge."""

    completes = 0

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.method == "POST" and "uploadId=" in request.query_string:
            await request.read()
            self.completes += 1
            self._record(request, 200)
            return web.Response(status=200, body=_ERROR_200,
                                headers={"Content-Type": "application/xml"})
        return await super()._handle(request)


class PartErrorProxy(HTTPFaultProxy):
    """An S3 proxy that answers the first ``fail`` ``UploadPart`` requests with
    ``status`` (without forwarding them; ``None``: every one) and forwards the rest."""

    def __init__(self, upstream: str, *, fail: int | None, status: int = 500) -> None:
        super().__init__(upstream)
        self.fail, self.status = fail, status
        self.failed = 0
        self.parts = 0

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.method == "PUT" and "partNumber=" in request.query_string:
            self.parts += 1
            if self.fail is None or self.failed < self.fail:
                self.failed += 1  # (before any await: parts arrive concurrently)
                await request.read()
                self._record(request, self.status)
                return web.Response(status=self.status, body=_PART_ERROR,
                                    headers={"Content-Type": "application/xml"})
        return await super()._handle(request)


_PART_ERROR = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
               b"<Message>We encountered an internal error. Please try again.</Message></Error>")


class RawHTTPServer:
    """A hand-written HTTP/1.1 server on loopback for answers aiohttp's server will
    not produce: bodies delimited only by closing the connection (no
    ``Content-Length``, no chunking), lying ``Content-Range`` headers.

    ``respond(method, headers, attempt)`` returns the raw response (bytes, or an
    iterable of bytes to send and floats, seconds to pause: a trickle, which may be
    endless); the connection is closed after it (``Connection: close``). ``attempt`` counts
    requests from 0. ``requests`` records ``(method, headers)``.
    """

    def __init__(self, respond: Callable[[str, dict[str, str], int], Any]) -> None:
        import socketserver
        import threading

        outer = self
        self.respond = respond
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
                method = head[0].split(" ", 1)[0]
                headers = {}
                for line in head[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                with outer._lock:
                    attempt = len(outer.requests)
                    outer.requests.append((method, headers))
                answer = outer.respond(method, headers, attempt)
                try:
                    for piece in [answer] if isinstance(answer, bytes) else answer:
                        if isinstance(piece, bytes):
                            self.request.sendall(piece)
                        else:  # a pause, in seconds (a server that trickles)
                            time.sleep(piece)
                    self.request.shutdown(socket.SHUT_WR)  # orderly FIN: looks like a clean end
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.port}/{key}"

    def __enter__(self) -> RawHTTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def raw_object_responder(data: bytes, *, etag: str = '"v1"', cut_at: int | None = None,
                         cut_times: int | None = None,
                         content_range: Callable[[int, int, int], str] | None = None,
                         ) -> Callable[[str, dict[str, str], int], bytes]:
    """A :class:`RawHTTPServer` responder serving ``data`` with EOF-delimited bodies.

    ``cut_at``: send only this many body bytes of a GET (on the first ``cut_times``
    GETs; all when ``None``). ``content_range(first, last, total)`` overrides the
    ``Content-Range`` value.
    """
    gets = [0]

    def respond(method: str, headers: dict[str, str], _attempt: int) -> bytes:
        size = len(data)
        if method == "HEAD":
            return (f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nETag: {etag}\r\n"
                    f"Accept-Ranges: bytes\r\nConnection: close\r\n\r\n").encode()
        rng = headers.get("range", "")
        first_s, _, last_s = rng.removeprefix("bytes=").partition("-")
        first, last = int(first_s), min(int(last_s), size - 1)
        body = data[first:last + 1]
        gets[0] += 1
        if cut_at is not None and (cut_times is None or gets[0] <= cut_times):
            body = body[:cut_at]
        cr = content_range(first, last, size) if content_range else f"bytes {first}-{last}/{size}"
        return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: {cr}\r\nETag: {etag}\r\n"
                f"Connection: close\r\n\r\n").encode() + body

    return respond


class FlippingTCPProxy(TCPFaultProxy):
    """A TCP proxy that flips one bit in the first client->server occurrence of
    ``marker`` (e.g. inside a value being written), once. ``flipped`` counts it."""

    def __init__(self, host: str, port: int, marker: bytes) -> None:
        super().__init__(host, port)
        self.marker = marker
        self.flipped = 0

    async def _pump_up(self, creader: Any, uwriter: Any) -> None:
        pending = b""
        while True:
            data = await creader.read(1 << 16)
            pending += data
            if not self.flipped and self.marker in pending:
                at = pending.index(self.marker) + len(self.marker) // 2
                pending = pending[:at] + bytes([pending[at] ^ 0x20]) + pending[at + 1:]
                self.flipped += 1
            # Hold back only a tail that could start the marker (all of it at EOF).
            cut = len(pending)
            if data and not self.flipped:
                cut -= _marker_prefix_tail(pending, self.marker)
            out, pending = pending[:cut], pending[cut:]
            if out:
                uwriter.write(out)
                await uwriter.drain()
            if not data:
                return


def _marker_prefix_tail(data: bytes, marker: bytes) -> int:
    """Length of the longest suffix of ``data`` that is a proper prefix of ``marker``."""
    for n in range(min(len(data), len(marker) - 1), 0, -1):
        if data.endswith(marker[:n]):
            return n
    return 0


class MismatchedTLSServer:
    """A TLS listener on 127.0.0.1 whose certificate (from its own trustme CA, at
    :attr:`ca_bundle_path`) names another host: a verifying client must refuse it."""

    def __init__(self, directory: str, name: str = "not-this-host.example") -> None:
        import ssl
        import threading

        import trustme

        ca = trustme.CA()
        self.ca_bundle_path = os.path.join(directory, "mismatch-ca.pem")
        ca.cert_pem.write_to_path(self.ca_bundle_path)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(name).configure_cert(ctx)
        self._ctx = ctx
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.handshakes = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.handshakes += 1
            try:
                conn.settimeout(5)
                with self._ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Files of this process may not grow past ``limit`` bytes (``RLIMIT_FSIZE``):
    a write past it fails with ``EFBIG``, as a full disk fails one with ``ENOSPC``
    (the same bare ``OSError`` without a file name; no mount needed)."""
    import resource
    import signal

    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a kill
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)
