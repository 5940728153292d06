"""A fault-injecting HTTP/1.1 proxy for tests (e.g. in front of moto's S3 server).

It runs in its **own thread and event loop** on ``127.0.0.1`` and a free port,
so the code under test may use tensorstream's sync or async API::

    with HTTPFaultProxy("http://127.0.0.1:9000") as proxy:   # e.g. in front of moto
        proxy.faults.status_script = [503, 503]  # the next two requests fail
        proxy.faults.ignore_range = True         # strip Range: the upstream answers 200
        assert proxy.requests[-1].status == 503

Faults are plain attributes of :class:`HTTPProxyFaults` (set them before the
client runs); ``faults.reset()`` restores a transparent proxy. Every request
answered is in :attr:`HTTPFaultProxy.requests` (:class:`ProxyRequest`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar

from .fault_settings import KnownFields, _chunk_for, _reset_fields, _run_hook
from .http_headers import request_repr, retry_after_header
from .in_flight import InFlight
from .loop_thread import _SHUTDOWN_TIMEOUT, _LoopThread

__all__ = ["HTTPFaultProxy", "HTTPProxyFaults", "ProxyRequest"]

#: ``hook(method, path)`` run before a request is forwarded (HTTP proxy).
RequestHook = Callable[[str, str], Awaitable[None]]


@dataclasses.dataclass
class HTTPProxyFaults(KnownFields):
    """What :class:`HTTPFaultProxy` does to requests and responses."""

    fixture: ClassVar[str] = "tensorstream_s3"

    #: Only requests whose path starts with this are affected (``None``: all).
    path_prefix: str | None = None
    #: ... and only those whose query names this parameter (``"encryption"``: S3's
    #: ``GetBucketEncryption``, ``"uploadId"``: a multipart upload's requests; ``None``: all).
    query: str | None = None
    #: Seconds to wait before forwarding a request.
    latency: float = 0.0
    #: Response body bytes per second, per response.
    rate_limit: int | None = None
    #: Close the connection after this many body bytes ...
    drop_after: int | None = None
    #: ... on this many responses longer than that (``None``: every one).
    drop_times: int | None = None
    #: Only answers to these methods are paced and cut (``None``: every answer). The common
    #: ``faults.rate_limit()``/``drop_after()`` of ``tensorstream_s3`` set ``("GET",)``: they
    #: act on downloads only, not on an upload's answers (a multipart upload's XML).
    shaped_methods: tuple[str, ...] | None = None
    #: Statuses answered (without forwarding), in order, before normal service resumes
    #: (a 2xx entry: that request is forwarded). Taken in the order requests arrive (their
    #: headers), before their bodies are read and before ``latency``.
    status_script: list[int] = dataclasses.field(default_factory=list)
    #: ``Retry-After`` seconds sent with scripted statuses.
    retry_after: float | None = None
    #: Strip ``Range``/``If-Range`` from requests: the upstream answers 200 with the whole body.
    ignore_range: bool = False
    #: For upstreams that check signatures (moto with auth): ``path -> whole object``.
    #: With ``ignore_range`` the signed ``Range`` then stays, and the proxy answers
    #: 200 with these bytes itself (the upstream's other headers kept).
    whole_body: Callable[[str], bytes] | None = None
    #: Awaited before each affected request is forwarded (after latency and the status
    #: script; the request's body read). Raising ``ConnectionError`` hangs up on the
    #: client (the connection is cut, no answer, nothing logged or recorded; an HTTP
    #: client may send a GET/PUT/DELETE once more: aiohttp does); any other exception is
    #: a failed hook, kept in ``hook_errors`` (the request fails too).
    before_forward: RequestHook | None = None

    # counters (managed by the proxy)
    dropped: int = 0
    scripted: int = 0
    #: What ``before_forward`` raised other than ``ConnectionError`` (the pytest plugin
    #: fails the test with them at its teardown).
    hook_errors: list[BaseException] = dataclasses.field(default_factory=list)

    def reset(self) -> None:
        """Back to a transparent proxy, counters at zero."""
        _reset_fields(self)


@dataclasses.dataclass(frozen=True)
class ProxyRequest:
    """One request as the proxy saw it and the status the client got."""

    method: str
    path: str
    headers: Mapping[str, str]
    status: int

    __repr__ = request_repr


#: S3-style error codes for scripted statuses (S3 clients parse the XML body).
_S3_CODES = {400: "InvalidRequest", 403: "AccessDenied", 404: "NoSuchKey", 409: "Conflict",
             412: "PreconditionFailed", 429: "SlowDown", 500: "InternalError",
             501: "NotImplemented", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                         "te", "trailer", "transfer-encoding", "upgrade", "host",
                         "content-length", "expect"})


class HTTPFaultProxy:
    """An HTTP/1.1 proxy on ``127.0.0.1`` (free port) forwarding to ``upstream``
    (``http://host:port``), applying :class:`HTTPProxyFaults`.

    Clients use :attr:`url` as their endpoint. Request bodies are buffered
    (tests use small objects); response bodies are streamed.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = 0
        self.faults = HTTPProxyFaults()
        self._log: list[ProxyRequest] = []
        self._lock = threading.Lock()
        self._lt = _LoopThread("tensorstream-http-proxy")
        self._runner: Any = None
        self._session: Any = None
        self._in_flight = InFlight()
        #: Answers whose client hung up before the end (a client that had seen enough
        #: or gave up): counted, not logged, as a client may do so.
        self.hung_up = 0

    def __repr__(self) -> str:
        return f"HTTPFaultProxy({self.url} -> {self.upstream})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HTTPFaultProxy:
        """Start serving (idempotent); returns ``self``."""
        if self._lt.loop is not None:
            return self
        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        async def setup() -> None:
            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            # Short graceful shutdown (see http_server): no handler left pending at close.
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                         shutdown_timeout=_SHUTDOWN_TIMEOUT)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0, reuse_address=True)
            await site.start()
            self.port = self._runner.addresses[0][1]
            self._session = ClientSession(
                connector=TCPConnector(limit=0), auto_decompress=False,
                timeout=ClientTimeout(total=None, sock_connect=10, sock_read=120),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )

        async def teardown() -> None:
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        self._teardown = teardown
        self._lt.start(setup)
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._lt.loop is not None:
            self._lt.stop(self._teardown)
        self._runner = self._session = None

    def __enter__(self) -> HTTPFaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def requests(self) -> list[ProxyRequest]:
        """Every request answered so far (a copy)."""
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def cancel_requests(self) -> None:
        """End the requests being answered now (see :meth:`HTTPTestServer.cancel_requests
        <tensorstream.testing.http_server.HTTPTestServer.cancel_requests>`)."""
        self._in_flight.cancel()

    def _record(self, request: Any, status: int) -> None:
        with self._lock:
            self._log.append(ProxyRequest(request.method, request.path_qs,
                                          dict(request.headers), status))

    async def _handle(self, request: Any) -> Any:
        with self._in_flight.track():
            return await self._answer(request)

    async def _answer(self, request: Any) -> Any:
        from aiohttp import web
        from yarl import URL

        f = self.faults
        affected = (f.path_prefix is None or request.path.startswith(f.path_prefix)) \
            and (f.query is None or f.query in request.query)
        # The script's next status goes to the next request to *arrive* (its headers; this
        # handler runs then), not to the next whose body is in: a large PUT sent first took
        # the status of a small request sent after it.
        status = f.status_script.pop(0) if affected and f.status_script else 200
        body = await request.read()
        if affected and f.latency:
            await asyncio.sleep(f.latency)
        if not 200 <= status < 300:
            f.scripted += 1
            return self._scripted(request, status)
        if affected and f.before_forward is not None:
            try:
                await _run_hook(f.hook_errors, f.before_forward(request.method, request.path))
            except ConnectionError:
                # The hook asked for a hang-up: cut the connection, quietly, as a drop
                # does (raised on, aiohttp logged it at ERROR with its traceback).
                if request.transport is not None:
                    request.transport.close()
                return web.Response()  # never sent: the connection is closed
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        # Keep the client's Host: SigV4 signs it, so the upstream must see the same one.
        headers["Host"] = request.host
        has_range = any(k.lower() == "range" for k in headers)
        answer_whole = affected and f.ignore_range and f.whole_body is not None and has_range
        if affected and f.ignore_range and not answer_whole:
            headers = {k: v for k, v in headers.items() if k.lower() not in ("range", "if-range")}
        async with self._session.request(
            # The path and query exactly as the client sent them: SigV4 signs their
            # encoding, so re-quoting (%2F -> /) would break the signature.
            request.method, URL(self.upstream + request.raw_path, encoded=True), headers=headers,
            data=body if body else None, allow_redirects=False,
        ) as upstream:
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            status, reason, length = upstream.status, upstream.reason, upstream.content_length
            read = upstream.content.read
            if answer_whole and status == 206 and f.whole_body is not None:
                whole = await asyncio.get_running_loop().run_in_executor(
                    None, f.whole_body, request.path)
                out = {k: v for k, v in out.items()
                       if k.lower() not in ("content-range", "content-length")}
                status, reason, length = 200, "OK", len(whole)
                read = _MemoryBody(whole).read
            resp = web.StreamResponse(status=status, reason=reason, headers=out)
            if length is not None:
                resp.content_length = length
            self._record(request, status)
            try:
                return await self._send(request, resp, read, length, affected)
            except ConnectionResetError:
                transport = request.transport
                if transport is not None and not transport.is_closing():
                    raise  # not the client's side: a real error
                # The client hung up mid-answer (it had seen enough, or gave up): normal
                # for a client, and aiohttp logged it as the proxy's error with a traceback.
                with self._lock:
                    self.hung_up += 1
                return resp

    async def _send(self, request: Any, resp: Any, read: Callable[[int], Awaitable[bytes]],
                    length: int | None, affected: bool) -> Any:
        """Send the answer's headers and its body (paced or cut as the faults say)."""
        f = self.faults
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        # The drop is taken (and counted) before the body starts, so that with
        # drop_times concurrent responses cannot all be cut: times=1 is one cut.
        # A body of unknown length (chunked) is taken too, and given back below
        # if it ends within drop_after bytes.
        shaped = affected and (f.shaped_methods is None or request.method in f.shaped_methods)
        dropping = (shaped and f.drop_after is not None
                    and (length is None or length > f.drop_after)
                    and (f.drop_times is None or f.dropped < f.drop_times))
        if dropping:
            f.dropped += 1
        limit = f.drop_after if dropping else None
        rate = f.rate_limit if shaped else None
        sent = 0
        while True:
            size = _chunk_for(rate)
            if limit is not None:
                size = min(size, limit - sent)
            if size <= 0:
                break
            data = await read(size)
            if not data:
                break
            await resp.write(data)
            sent += len(data)
            if rate:
                await asyncio.sleep(len(data) / rate)
        if limit is not None:
            if length is None and (sent < limit or not await read(1)):
                f.dropped -= 1  # a chunked body that fit: nothing to cut
            else:
                if request.transport is not None:  # the client sees a short body
                    request.transport.close()
                return resp
        await resp.write_eof()
        return resp

    def _scripted(self, request: Any, status: int) -> Any:
        from aiohttp import web

        headers = {}
        if self.faults.retry_after is not None:
            headers["Retry-After"] = retry_after_header(self.faults.retry_after)
        body = b""
        if status >= 400 and request.method != "HEAD":
            code = _S3_CODES.get(status, "InternalError")
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                    f"<Message>scripted {status} from the test proxy</Message></Error>").encode()
            headers["Content-Type"] = "application/xml"
        self._record(request, status)
        return web.Response(status=status, body=body, headers=headers)


class _MemoryBody:
    """``upstream.content.read`` over bytes held in memory."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    async def read(self, size: int) -> bytes:
        chunk = bytes(self._view[self._pos:self._pos + size])
        self._pos += len(chunk)
        return chunk
