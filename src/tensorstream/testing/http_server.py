"""A real HTTP(S) object server on loopback, with fault injection, for tests.

:class:`HTTPTestServer` runs an aiohttp web app in its **own thread and
event loop**, so tests may call tensorstream's sync API (which runs on
tensorstream's own loop thread) or its async API (on the test's loop)::

    with HTTPTestServer(token="t0ken", tls=True) as server:
        server.put("model.tensors", data)
        with tensorstream.open(server.url("model.tensors"), **server.options) as f:
            ...
        server.faults.status_script = [503, 503]     # next two requests fail
        server.faults.drop_after = 1 << 20           # cut every body after 1 MiB
        assert server.requests[-1].headers["Range"] == "bytes=0-99"

Objects are served with correct ``Range`` (single ranges), ``HEAD``,
strong ``ETag``, ``If-Match``, ``Last-Modified``, ``If-Unmodified-Since`` and
``Accept-Ranges``.
Faults (:class:`HTTPFaults`) apply to every request, or only to ``faults.key``
when set; ``faults.reset()`` clears them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hashlib
import os
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from email.utils import formatdate, parsedate_to_datetime
from types import TracebackType
from typing import Any

from aiohttp import web

from .http_faults import HTTPFaults
from .http_headers import request_repr, retry_after_header
from .in_flight import InFlight
from .loop_thread import _SHUTDOWN_TIMEOUT, _LoopThread

__all__ = ["HTTPFaults", "HTTPTestServer", "RequestRecord", "StoredObject"]


@dataclasses.dataclass(frozen=True)
class StoredObject:
    data: bytes
    etag: str
    mtime: float


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (headers include Range, If-Match, Authorization)."""

    method: str
    path: str
    headers: Mapping[str, str]
    status: int

    __repr__ = request_repr  # credential headers as ***


def _stored(data: bytes, mtime: float | None = None) -> StoredObject:
    return StoredObject(bytes(data), f'"{hashlib.md5(data).hexdigest()}"',
                        time.time() if mtime is None else mtime)


class HTTPTestServer:
    """An aiohttp object server on ``127.0.0.1`` (free port) in a background thread.

    ``token``: require ``Authorization: Bearer <token>`` (else 401).
    ``basic_auth``: require this ``(user, password)`` instead.
    ``query``: require these query parameters on every request (else 403), like a
    token or a signature in a shared URL.
    ``tls``: serve HTTPS with a certificate from a throwaway ``trustme`` CA whose
    PEM is at :attr:`ca_bundle_path`; ``require_client_cert`` also demands a
    client certificate (:attr:`client_cert_path`, :attr:`client_key_path`).
    ``tmp_dir``: where the certificates' temporary directory goes (default: the system's).
    """

    def __init__(self, *, token: str | None = None, basic_auth: tuple[str, str] | None = None,
                 tls: bool = False, require_client_cert: bool = False,
                 query: Mapping[str, str] | None = None, tmp_dir: str | None = None) -> None:
        self.token = token
        self.tmp_dir = tmp_dir
        self.query = dict(query) if query else None
        self.basic_auth = basic_auth
        self.tls = tls or require_client_cert
        self.require_client_cert = require_client_cert
        self.faults = HTTPFaults()
        self.port = 0
        self.ca_bundle_path: str | None = None
        self.client_cert_path: str | None = None
        self.client_key_path: str | None = None
        self._objects: dict[str, StoredObject] = {}
        self._log: list[RequestRecord] = []
        self._sent: dict[str, int] = {}
        self._writing: dict[str, int] = {}  # bodies being written, per key
        self._lock = threading.Lock()
        self._body_done = threading.Condition(self._lock)
        self._lt = _LoopThread("tensorstream-test-http")
        self._runner: web.AppRunner | None = None
        self._tmpdir: str | None = None
        self._in_flight = InFlight()

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> HTTPTestServer:
        """Start serving (idempotent); returns ``self``."""
        if self._lt.loop is not None:
            return self
        ssl_ctx = self._make_tls() if self.tls else None

        async def serve() -> None:
            app = web.Application()
            # [\s\S], not ".": a key may hold a line break ("." stopped there: a 404).
            app.router.add_route("*", r"/{key:[\s\S]*}", self._handle)
            # A short graceful shutdown: stop() waits 10 s for cleanup, and aiohttp's
            # default 60 s left stalled handlers pending when the loop closed (an
            # "Event loop is closed" unraisable per handler: a failure under -W error).
            runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                   shutdown_timeout=_SHUTDOWN_TIMEOUT)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx, reuse_address=True)
            await site.start()
            self._runner = runner
            self.port = runner.addresses[0][1]

        try:
            self._lt.start(serve)
        except BaseException:
            self.stop()  # (the certificates' folder)
            raise
        return self

    def stop(self) -> None:
        """Stop serving and remove temporary certificates (idempotent)."""
        runner = self._runner
        self._lt.stop(runner.cleanup if runner is not None else None)
        self._runner = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> HTTPTestServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _make_tls(self) -> ssl.SSLContext:
        from .extras import trustme as _trustme

        trustme = _trustme()

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        self._tmpdir = tempfile.mkdtemp(prefix="tensorstream-http-tls-", dir=self.tmp_dir)
        self.ca_bundle_path = os.path.join(self._tmpdir, "ca.pem")
        ca.cert_pem.write_to_path(self.ca_bundle_path)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(ctx)
        if self.require_client_cert:
            client = ca.issue_cert("tensorstream-client@example.com")
            self.client_cert_path = os.path.join(self._tmpdir, "client.pem")
            self.client_key_path = os.path.join(self._tmpdir, "client.key")
            for blob in client.cert_chain_pems:
                blob.write_to_path(self.client_cert_path, append=True)
            client.private_key_pem.write_to_path(self.client_key_path)
            ca.configure_trust(ctx)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    # -- objects and log ------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def url(self, key: str) -> str:
        """The URL of ``key`` (no credentials in it)."""
        return f"{self.base_url}/{key.lstrip('/')}"

    uri = url  # the pytest plugin's backend API calls it ``uri``

    @property
    def options(self) -> dict[str, Any]:
        """Storage options a client needs: token and CA bundle."""
        opts: dict[str, Any] = {}
        if self.token:
            opts["token"] = self.token
        if self.ca_bundle_path:
            opts["ca_bundle"] = self.ca_bundle_path
        if self.client_cert_path:
            opts["client_cert"] = self.client_cert_path
            opts["client_key"] = self.client_key_path
        return opts

    def put(self, key: str, data: bytes, *, mtime: float | None = None) -> None:
        """Store (or replace) an object; it gets a new ETag, and ``mtime`` (default:
        now) as its Last-Modified (HTTP dates count whole seconds)."""
        with self._lock:
            self._objects[key.lstrip("/")] = _stored(data, mtime)

    def get(self, key: str) -> bytes:
        """The stored bytes of ``key`` (``KeyError`` if absent)."""
        with self._lock:
            return self._objects[key.lstrip("/")].data

    def etag(self, key: str) -> str:
        with self._lock:
            return self._objects[key.lstrip("/")].etag

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key.lstrip("/"), None)

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request answered so far (a copy)."""
        with self._lock:
            return list(self._log)

    def requests_for(self, key: str, method: str | None = None) -> list[RequestRecord]:
        """Requests whose path is ``/key`` (query ignored), optionally of one method."""
        want = "/" + key.lstrip("/")
        return [r for r in self.requests
                if r.path.split("?", 1)[0] == want and (method is None or r.method == method)]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()
            self._sent.clear()

    def cancel_requests(self) -> None:
        """End the requests being answered now (their clients see the connection
        closed): the plugin does so when a test ends, so that one its client gave up
        on cannot go on under the next test's faults."""
        self._in_flight.cancel()

    def bytes_sent(self, key: str | None = None, settle: float = 2.0) -> int:
        """Body bytes written to clients since the log was cleared: for ``key``, or all.

        A client can have its bytes before the server's handler has counted
        them, so this first waits (up to ``settle`` seconds) for bodies still
        being written -- of ``key``, or of any key -- to finish.
        """
        want = None if key is None else key.lstrip("/")
        with self._body_done:
            self._body_done.wait_for(
                lambda: not (self._writing if want is None else self._writing.get(want)), settle)
            if want is None:
                return sum(self._sent.values())
            return self._sent.get(want, 0)

    # -- serving --------------------------------------------------------------
    def _record(self, request: web.BaseRequest, status: int) -> None:
        with self._lock:
            self._log.append(RequestRecord(request.method, request.path_qs,
                                           dict(request.headers), status))

    def _authorized(self, request: web.BaseRequest) -> bool:
        if self.query is not None and any(request.query.get(k) != v
                                          for k, v in self.query.items()):
            return False
        got = request.headers.get("Authorization", "")
        if self.token is not None and got != f"Bearer {self.token}":
            return False
        if self.basic_auth is not None:
            import base64

            want = base64.b64encode(":".join(self.basic_auth).encode()).decode()
            return got == f"Basic {want}"
        return True

    def _simple(self, request: web.BaseRequest, status: int,
                headers: dict[str, str] | None = None) -> web.Response:
        self._record(request, status)
        return web.Response(status=status, headers=headers)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._in_flight.track():
            return await self._answer(request)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        f = self.faults
        faulty = f.key is None or f.key == key
        if faulty and f.latency:
            await asyncio.sleep(f.latency)
        if faulty and f.redirect_to:
            return self._simple(request, 307,
                                {"Location": f.redirect_to.rstrip("/") + request.path_qs})
        # A scripted status goes to a request answered: not to one whose client left
        # during the latency (the entry stays for the next one, its retry). One ended by
        # cancel_requests during the latency never gets here: it takes none either.
        gone = request.transport is None or request.transport.is_closing()
        if faulty and f.status_script and not gone and not 200 <= (
                status := f.status_script.pop(0)) < 300:
            extra = ({"Retry-After": retry_after_header(f.retry_after)}
                     if f.retry_after is not None else {})
            return self._simple(request, status, extra)
        if not self._authorized(request):
            if self.query is not None and self.token is None and self.basic_auth is None:
                return self._simple(request, 403)
            return self._simple(request, 401, {"WWW-Authenticate": "Bearer"})
        if request.method not in ("GET", "HEAD"):
            return self._simple(request, 405, {"Allow": "GET, HEAD"})
        with self._lock:
            obj = self._objects.get(key)
            if obj is not None and faulty and request.method == "GET":
                f.gets += 1
                if (f.replace_after_requests is not None and not f.replaced
                        and f.gets > f.replace_after_requests):
                    new = (f.replace_with if f.replace_with is not None  # b"" empties it
                           else bytes(b ^ 0xFF for b in obj.data))
                    obj = self._objects[key] = _stored(new)
                    f.replaced = True
        if obj is None:
            return self._simple(request, 404)
        if_match = request.headers.get("If-Match")
        if faulty and f.ignore_if_match:
            if_match = None
        if if_match is not None and if_match.strip() != "*" and obj.etag not in [
                t.strip() for t in if_match.split(",")]:
            return self._simple(request, 412)
        since = request.headers.get("If-Unmodified-Since")
        if if_match is None and since and not (faulty and f.ignore_if_unmodified_since):
            try:
                limit = parsedate_to_datetime(since).timestamp()
            except (TypeError, ValueError):
                limit = None
            if limit is not None and int(obj.mtime) > limit:
                return self._simple(request, 412)
        return await self._serve(request, obj, faulty)

    async def _serve(self, request: web.Request, obj: StoredObject,
                     faulty: bool) -> web.StreamResponse:
        f = self.faults
        size = len(obj.data)
        headers = {"ETag": obj.etag, "Accept-Ranges": "bytes",
                   "Last-Modified": formatdate(obj.mtime, usegmt=True)}
        if faulty and (f.no_etag or (f.etag_on_head_only and request.method != "HEAD")):
            del headers["ETag"]
        if faulty and f.no_last_modified:
            del headers["Last-Modified"]
        status, body = 200, obj.data
        rng = request.headers.get("Range")
        if rng and not (faulty and f.ignore_range):
            try:
                sl = request.http_range
            except ValueError:
                return self._simple(request, 416, {"Content-Range": f"bytes */{size}"})
            start, stop, _ = sl.indices(size)
            if (sl.start is not None and sl.start >= size) or start >= stop:
                return self._simple(request, 416, {"Content-Range": f"bytes */{size}"})
            if faulty and f.wrong_content_range:
                start, stop = start + 1, min(stop + 1, size)
            status, body = 206, obj.data[start:stop]
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        if faulty and f.gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(status=status, headers=headers)
        if faulty and f.no_content_length:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(body)
        self._record(request, status)
        try:
            return await self._send(request, resp, body, faulty)
        except ConnectionResetError:
            # The client hung up (it refused what it saw, or gave up waiting out a
            # latency): not a server error, and aiohttp logged it as one with a traceback.
            return resp

    async def _send(self, request: web.Request, resp: web.StreamResponse, body: bytes,
                    faulty: bool) -> web.StreamResponse:
        """Send the answer's headers and its body (stalled, paced or cut as the faults say)."""
        f = self.faults
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        if faulty and f.stall_after_headers and (
                f.stall_times is None or f.stalled < f.stall_times):
            f.stalled += 1
            await asyncio.sleep(f.stall_after_headers)
        limit = len(body)
        # Only a body longer than drop_after is cut, and only a cut spends one of
        # drop_times and counts in ``dropped`` (as on the proxies): a short answer
        # before the big read must not use up ``times=1``.
        drop = faulty and f.drop_after is not None and f.drop_after < len(body) and (
            f.drop_times is None or f.dropped < f.drop_times)
        if drop:
            f.dropped += 1
            limit = f.drop_after or 0
        await self._write_body(resp, memoryview(body)[:limit], faulty,
                               request.match_info.get("key", ""))
        if drop:
            # Cut the connection mid-body: the client sees a short read.
            if request.transport is not None:
                request.transport.close()
            return resp
        await resp.write_eof()
        return resp

    async def _write_body(self, resp: web.StreamResponse, body: memoryview,
                          paced: bool, key: str) -> None:
        with self._lock:
            self._writing[key] = self._writing.get(key, 0) + 1
        try:
            await self._write_paced(resp, body, paced, key)
        finally:
            with self._body_done:
                self._writing[key] -= 1
                if not self._writing[key]:
                    del self._writing[key]
                self._body_done.notify_all()

    async def _write_paced(self, resp: web.StreamResponse, body: memoryview,
                           paced: bool, key: str) -> None:
        # ``faults.rate_limit`` (bytes/s of each body) is read again at every
        # step, so a test can slow a link down or speed it up while bodies are
        # in progress.
        rate: int | None = None
        sent, t0, i = 0, time.monotonic(), 0
        while i < len(body):
            now_rate = self.faults.rate_limit if paced else None
            if now_rate != rate:  # the link changed: pace from here on
                rate, sent, t0 = now_rate, 0, time.monotonic()
            step = 256 << 10 if not rate else max(1, min(64 << 10, rate // 20))
            await resp.write(body[i : i + step])
            with self._lock:
                self._sent[key] = self._sent.get(key, 0) + len(body[i : i + step])
            i += step
            sent += step
            if rate:
                ahead = sent / rate - (time.monotonic() - t0)
                if ahead > 0:
                    await asyncio.sleep(ahead)
