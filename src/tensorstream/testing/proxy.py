"""Fault-injecting proxies for tests: one for raw TCP, one that understands HTTP.

Both run in their **own thread and event loop** on ``127.0.0.1`` and a free
port, so the code under test may use tensorstream's sync or async API::

    with TCPFaultProxy("127.0.0.1", redis_port) as proxy:
        proxy.faults.drop_after = 1 << 20        # cut each connection after 1 MiB downstream
        proxy.faults.use_rst = True              # ... with a TCP reset instead of a FIN
        client = redis.Redis(port=proxy.port)

    with HTTPFaultProxy("http://127.0.0.1:9000") as proxy:   # e.g. in front of moto
        proxy.faults.status_script = [503, 503]  # the next two requests fail
        proxy.faults.ignore_range = True         # strip Range: the upstream answers 200
        assert proxy.requests[-1].status == 503

Faults are plain attributes (set them before the client runs); ``faults.reset()``
restores a transparent proxy. Counters on the faults object tell a test what
happened (connections, drops, scripted answers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import itertools
import math
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, ClassVar, TypeVar

__all__ = ["HTTPFaultProxy", "HTTPProxyFaults", "ProxyRequest", "TCPFaultProxy", "TCPFaults"]

_CHUNK = 64 << 10
#: Seconds a stopping server lets requests in flight finish before cancelling them.
_SHUTDOWN_TIMEOUT = 2.0
#: ``hook(method, path)`` run before a request is forwarded (HTTP proxy).
RequestHook = Callable[[str, str], Awaitable[None]]
#: ``hook(data)`` run before client bytes are forwarded upstream (TCP proxy).
DataHook = Callable[[bytes], Awaitable[None]]


class KnownFields:
    """Base of the fault settings dataclasses: setting a name that is not one of
    the class's fields raises :class:`AttributeError` saying what was meant.

    Without it ``faults.raw.wrong_content_rnage = True`` (misspelt) or
    ``tensorstream_s3.faults.raw.use_rst = True`` (a Redis proxy's setting) was
    stored as a new attribute, injected nothing, and the test passed untested."""

    #: The fixture whose ``faults.raw`` this class is (named in the error).
    fixture: ClassVar[str] = ""
    _kinds: ClassVar[list[type[KnownFields]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        KnownFields._kinds.append(cls)

    def __getattr__(self, name: str) -> Any:
        # Only called for a name that is not there: say what was meant.
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(unknown_setting(type(self), name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _settings(type(self)):
            raise AttributeError(unknown_setting(type(self), name))
        super().__setattr__(name, value)


def _settings(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def unknown_setting(cls: type[KnownFields], name: str) -> str:
    """Why ``name`` is no setting of ``cls``: another backend's, or a likely misspelling."""
    fields = _settings(cls)
    owners = sorted(f"{k.fixture} ({k.__name__})" for k in KnownFields._kinds
                    if k is not cls and name in _settings(k))
    where = f"{cls.__name__}" + (f" of {cls.fixture}" if cls.fixture else "")
    if owners:
        return f"{name} is a fault of {', '.join(owners)}, not of {where}"
    close = difflib.get_close_matches(name, fields, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{where} has no setting {name!r}: {hint}its settings are {', '.join(fields)}"


def _reset_fields(obj: Any) -> None:
    for field in dataclasses.fields(obj):
        default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                   else field.default)
        setattr(obj, field.name, default)


async def cancel_pending() -> None:
    """Cancel every other task of the running loop and wait for them: a handler
    still stalled or paced when a server stops would otherwise be destroyed
    pending when its loop closes ("Task was destroyed but it is pending",
    "Event loop is closed" unraisables that fail a ``-W error`` run)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


def retry_after_header(seconds: float) -> str:
    """``Retry-After``'s value for ``seconds``: a whole number as HTTP's delta-seconds
    (``2``; ``2.0`` made urllib3, hence requests, raise ``InvalidHeader``). A fraction,
    for quick tests, or a value that is no number at all, for tests of a client's
    handling of odd headers, is sent as given."""
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
            and math.isfinite(seconds) and float(seconds).is_integer():
        return str(int(seconds))
    return str(seconds)


async def _run_hook(errors: list[BaseException], call: Awaitable[None]) -> None:
    """Await a test's hook, keeping what it raised in ``errors`` unless it is a
    ``ConnectionError`` (the way a hook cuts a connection on purpose). The proxy's
    loop only logged a failed hook (an assertion in it, a typo) and the client's
    retry hid it: the test passed."""
    try:
        await call
    except ConnectionError:
        raise
    except Exception as exc:
        errors.append(exc)
        raise


def _chunk_for(rate: int | None) -> int:
    # Small writes when rate-capped, so pacing is smooth (about 20 steps a second).
    return _CHUNK if not rate else max(1, min(_CHUNK, rate // 20))


class _LoopThread:
    """An event loop in a daemon thread that serves one proxy."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, setup: Callable[[], Coroutine[Any, Any, None]]) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(setup())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self.loop = loop
        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            self.stop(None)
            raise RuntimeError(f"{self.name} failed to start: {failure[0]!r}") from failure[0]

    def stop(self, teardown: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
        loop, thread = self.loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            for step in (teardown, cancel_pending):
                if step is None:
                    continue
                try:
                    asyncio.run_coroutine_threadsafe(step(), loop).result(10)
                except Exception:
                    pass
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        if loop is not None and not loop.is_running():
            loop.close()
        self.loop = self._thread = None


_S = TypeVar("_S", bound="_StreamServer")
#: Loop steps allowed from an accepted socket to its connection_made (asyncio takes 2-3).
_SETUP_STEPS = 5


class _StreamServer:
    """A listener on ``127.0.0.1`` (``asyncio.start_server``) served by its own
    :class:`_LoopThread`: the start, stop and ``with`` plumbing the stream-level
    proxies share (:class:`TCPFaultProxy`, :class:`~.forward_proxy.ForwardProxy`).

    A subclass names its thread, serves each connection in :meth:`_accept`, adds
    the writers of connections it opens to ``_writers`` (cut at stop; each
    client's is there from its first moment), and says how to cut one (:meth:`_abort`)."""

    _thread_name: ClassVar[str]

    def __init__(self, *, port: int = 0) -> None:
        self.port = port
        self._lt = _LoopThread(self._thread_name)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self: _S) -> _S:
        """Start listening (idempotent); returns ``self``."""
        if self._lt.loop is not None:
            return self

        async def setup() -> None:
            self._server = await asyncio.start_server(self._connected, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

        self._lt.start(setup)
        return self

    def stop(self) -> None:
        """Close the listener and every connection (idempotent)."""
        async def teardown() -> None:
            # A connection already accepted is set up over a few loop steps (an
            # accept task, then connection_made). Closed before that, the listener
            # makes asyncio drop it unclosed (its transport cannot attach to a
            # closed server), the client left waiting: let them reach _connected.
            for _ in range(_SETUP_STEPS):
                await asyncio.sleep(0)
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                self._abort(w)

        self._lt.stop(teardown)
        self._server = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        """Cut ``writer``'s connection at :meth:`stop`."""
        writer.transport.abort()

    def _connected(self, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> Coroutine[Any, Any, None]:
        """``start_server``'s callback, called as the connection is made, before its
        task starts: a connection whose task ``stop()`` cancels before its first
        step is still known, and cut (it stayed open, its client waiting)."""
        self._writers.add(writer)
        return self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._accept(reader, writer)
        finally:
            self._writers.discard(writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- TCP
@dataclasses.dataclass
class TCPFaults(KnownFields):
    """What :class:`TCPFaultProxy` does to traffic. Downstream = upstream -> client."""

    fixture: ClassVar[str] = "tensorstream_redis"

    #: Seconds to wait before forwarding each burst of client bytes (adds per-request latency).
    latency: float = 0.0
    #: Downstream bytes per second, per connection.
    rate_limit: int | None = None
    #: Cut a connection once this many downstream bytes went through it ...
    drop_after: int | None = None
    #: ... on this many connections (``None``: every connection).
    drop_times: int | None = None
    #: Cut with a TCP reset (RST) instead of an orderly close (FIN).
    use_rst: bool = False
    #: Reset this many new connections as soon as they are accepted.
    refuse: int = 0
    #: Hold downstream bytes (the connection stays open but silent) while true.
    stall: bool = False
    #: Called with each burst of client bytes before it is forwarded. Raising
    #: ``ConnectionError`` cuts the connection (the burst is not forwarded); any other
    #: exception is a failed hook, kept in ``hook_errors``.
    on_client_data: DataHook | None = None

    # counters (managed by the proxy)
    connections: int = 0
    dropped: int = 0
    refused: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    #: What ``on_client_data`` raised other than ``ConnectionError`` (the pytest
    #: plugin fails the test with them at its teardown).
    hook_errors: list[BaseException] = dataclasses.field(default_factory=list)
    #: Which setting of ``drop_after`` is in force (changed by each assignment).
    _drop_epoch: ClassVar[int] = 0

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "drop_after":
            # Each setting of drop_after is a new fault: connections count their bytes
            # from here (see TCPFaultProxy._pump_down).
            object.__setattr__(self, "_drop_epoch", next(_drop_epochs))

    def reset(self) -> None:
        """Back to a transparent proxy, counters at zero."""
        _reset_fields(self)

    def _drop_left(self, count: int) -> int | None:
        """Bytes a connection that has sent ``count`` since the fault may still send
        before it is cut, or ``None`` when no cut applies."""
        if self.drop_after is None or (self.drop_times is not None
                                       and self.dropped >= self.drop_times):
            return None
        return self.drop_after - count


_drop_epochs = itertools.count()


def _abort(writer: asyncio.StreamWriter, rst: bool) -> None:
    sock = writer.get_extra_info("socket")
    if rst and sock is not None:
        try:  # SO_LINGER with a zero timeout turns close() into a reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    if rst:
        writer.transport.abort()
    else:
        writer.close()


class TCPFaultProxy(_StreamServer):
    """A TCP proxy on ``127.0.0.1`` (free port) to ``host:port`` that can delay,
    cap, stall, cut or reset connections (see :class:`TCPFaults`)."""

    _thread_name = "tensorstream-tcp-proxy"

    def __init__(self, host: str, port: int, *, listen_port: int = 0) -> None:
        super().__init__(port=listen_port)
        self.upstream = (host, port)
        self.faults = TCPFaults()

    def __repr__(self) -> str:
        return f"TCPFaultProxy(127.0.0.1:{self.port} -> {self.upstream[0]}:{self.upstream[1]})"

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        _abort(writer, rst=True)

    def cut_all(self, *, rst: bool = True) -> None:
        """Cut every open connection now (a reset by default)."""
        loop = self._lt.loop
        if loop is None:
            return

        async def cut() -> None:
            for w in list(self._writers):
                _abort(w, rst)

        asyncio.run_coroutine_threadsafe(cut(), loop).result(10)

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        f = self.faults
        f.connections += 1
        if f.refuse > 0:
            f.refuse -= 1
            f.refused += 1
            _abort(cwriter, rst=True)
            return
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(cwriter, rst=True)
            return
        self._writers.add(uwriter)
        up = asyncio.ensure_future(self._pump_up(creader, uwriter))
        down = asyncio.ensure_future(self._pump_down(ureader, cwriter))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            cut = down.done() and not down.cancelled() and down.exception() is None and down.result()
            _abort(cwriter, rst=bool(cut) and self.faults.use_rst)
            _abort(uwriter, rst=False)
            self._writers.discard(uwriter)

    async def _pump_up(self, creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter) -> None:
        while data := await creader.read(_CHUNK):
            f = self.faults
            if f.on_client_data is not None:
                await _run_hook(f.hook_errors, f.on_client_data(data))
            if f.latency:
                await asyncio.sleep(f.latency)
            f.bytes_up += len(data)
            uwriter.write(data)
            await uwriter.drain()

    async def _pump_down(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> bool:
        """Forward upstream bytes; True when the connection was cut on purpose."""
        # drop_after counts the bytes sent since it was set: a connection older than
        # the fault (a client's pooled one) counted its earlier answers too and was cut
        # at once, or after whatever read was under way, not after drop_after bytes.
        f = self.faults
        sent, epoch = 0, f._drop_epoch

        def left() -> int | None:
            nonlocal sent, epoch
            if self.faults._drop_epoch != epoch:
                sent, epoch = 0, self.faults._drop_epoch
            return self.faults._drop_left(sent)

        while True:
            f = self.faults
            size = _chunk_for(f.rate_limit)
            allowed = left()
            if allowed is not None:
                # At the limit, wait for one byte more: only a connection longer than
                # drop_after is cut and counted (one of exactly that length was cut at
                # once, spending times=1 on it).
                size = max(1, min(size, allowed))
            data = await ureader.read(size)
            if not data:
                return False
            allowed = left()  # the fault may have been set while the read waited
            cut = allowed is not None and len(data) > allowed
            if allowed is not None and cut:
                data = data[:max(0, allowed)]
            while self.faults.stall:
                await asyncio.sleep(0.01)
            cwriter.write(data)
            await cwriter.drain()
            sent += len(data)
            f.bytes_down += len(data)
            if cut:
                f.dropped += 1
                return True
            if f.rate_limit:
                await asyncio.sleep(len(data) / f.rate_limit)


# -------------------------------------------------------------------------- HTTP
@dataclasses.dataclass
class HTTPProxyFaults(KnownFields):
    """What :class:`HTTPFaultProxy` does to requests and responses."""

    fixture: ClassVar[str] = "tensorstream_s3"

    #: Only requests whose path starts with this are affected (``None``: all).
    path_prefix: str | None = None
    #: Seconds to wait before forwarding a request.
    latency: float = 0.0
    #: Response body bytes per second, per response.
    rate_limit: int | None = None
    #: Close the connection after this many body bytes ...
    drop_after: int | None = None
    #: ... on this many responses longer than that (``None``: every one).
    drop_times: int | None = None
    #: Statuses answered (without forwarding), in order, before normal service resumes
    #: (a 2xx entry: that request is forwarded).
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
    #: script). Raising ``ConnectionError`` fails the request; any other exception is a
    #: failed hook, kept in ``hook_errors`` (the request fails too).
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


#: Request headers whose values are credentials (``***`` in a request's repr).
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie",
                             "x-amz-security-token", "x-api-key"})


def request_repr(record: Any) -> str:
    """``Name(method=..., path=..., headers=..., status=...)`` with credential
    headers as ``***``: a failed assertion or a print of ``backend.requests``
    must not put the test's token or password in the CI log. ``headers`` itself
    keeps them, for tests that check what was sent."""
    headers = {k: "***" if k.lower() in _SECRET_HEADERS else v for k, v in record.headers.items()}
    return (f"{type(record).__name__}(method={record.method!r}, path={record.path!r}, "
            f"headers={headers!r}, status={record.status!r})")


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
             502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}
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

    def _record(self, request: Any, status: int) -> None:
        with self._lock:
            self._log.append(ProxyRequest(request.method, request.path_qs,
                                          dict(request.headers), status))

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web
        from yarl import URL

        f = self.faults
        affected = f.path_prefix is None or request.path.startswith(f.path_prefix)
        body = await request.read()
        if affected and f.latency:
            await asyncio.sleep(f.latency)
        if affected and f.status_script and not 200 <= (status := f.status_script.pop(0)) < 300:
            f.scripted += 1
            return self._scripted(request, status)
        if affected and f.before_forward is not None:
            await _run_hook(f.hook_errors, f.before_forward(request.method, request.path))
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
            await resp.prepare(request)
            if request.method == "HEAD":
                return resp
            # The drop is taken (and counted) before the body starts, so that with
            # drop_times concurrent responses cannot all be cut: times=1 is one cut.
            dropping = (affected and f.drop_after is not None and length is not None
                        and length > f.drop_after
                        and (f.drop_times is None or f.dropped < f.drop_times))
            if dropping:
                f.dropped += 1
            limit = f.drop_after if dropping else None
            rate = f.rate_limit if affected else None
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
