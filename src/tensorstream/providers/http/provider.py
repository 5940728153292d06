"""HTTP(S) provider on aiohttp: ranged GETs that either return exactly the
bytes asked for or raise.

* ``stat``: ``HEAD`` for size / ETag / Last-Modified, falling back to a
  ``GET Range: bytes=0-0`` (presigned URLs are often signed for GET only).
* ``readinto``: one ranged GET streamed straight into the caller's buffer.
  The answer must be ``206`` with exactly the requested ``Content-Range`` and
  no ``Content-Encoding``; a server that ignores ``Range`` never yields wrong
  bytes. Pinned reads send ``If-Match`` and compare the response ETag.
* One pooled ``ClientSession`` per provider, created lazily inside the
  running loop; connect and idle (``sock_read``) timeouts, no whole-request
  timeout.
* ``readinto_blocking``: the same ranged GET on ``http.client`` in the calling
  thread (:mod:`._blocking_http`), received into the buffer without the GIL;
  same checks, errors and redirect rules.
* Redirects are followed by hand: credential headers are dropped when the
  origin changes or https is downgraded, and link-local / metadata addresses
  are refused unless ``allow_private_redirects=True``.

Read-only: capabilities are ``read`` and ``stat``. Retries, resume and error
context live in :mod:`tensorstream.layers.stack`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import warnings
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import aiohttp
from yarl import URL

from ...config import CommonConfig, split_options
from ...errors import (
    ConfigurationError,
    IncompleteReadError,
    InvalidRangeError,
    ProtocolError,
    TensorstreamError,
)
from ...readahead._memcopy import copy_into
from ...uri import redact
from .._http.headers import (
    REDIRECT_STATUSES,
    check_ranged_response,
    exception_error,
    is_metadata_address,
    note_etag,
    parse_content_range,
    parse_http_date,
    redact_path,
    redirect_step,
    refuse_metadata_target,
    status_error,
)
from .._http.range_get import ConnectionPool, RangeBody, RedirectPolicy, TLSSettings, open_range
from ..base import Capabilities, ObjectInfo, Provider
from .config import OPTIONS, HTTPCredentials, resolve_http_credentials

__all__ = ["HTTPProvider", "InsecureTLSWarning", "MAX_REDIRECTS"]

log = logging.getLogger("tensorstream.http")

MAX_REDIRECTS = 5
_REDIRECT_STATUSES = REDIRECT_STATUSES
#: aiohttp's per-response read buffer; larger means fewer pause/resume cycles.
_READ_BUFSIZE = 1 << 20
from ...errors import InsecureTLSWarning  # noqa: E402  (re-exported for compatibility)

_IDENTITY = {"Accept-Encoding": "identity"}
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def _redact_path(path: str) -> str:
    return redact_path(path)


def _map_error(
    source: BaseException | aiohttp.ClientResponse, path: str, *, received: int = 0
) -> TensorstreamError:
    """The one place HTTP statuses and aiohttp/OS errors become tensorstream errors
    (the shared pure mapping in :mod:`._http_util`, also used by the blocking path)."""
    if isinstance(source, aiohttp.ClientResponse):
        return status_error(source.status, source.reason or "", source.headers, path=path)
    return exception_error(source, path=path, received=received)


class HTTPProvider(Provider):
    """Objects behind one HTTP(S) origin, addressed by ``/path?query``.

    >>> async with tensorstream.get_provider("https://host/m.tensors", token="...") as p:
    ...     info = await p.stat("/m.tensors")  # doctest: +SKIP
    """

    schemes = ("http", "https")
    service = "http"
    capabilities: ClassVar[Capabilities] = Capabilities(read=True, stat=True, pinned_reads=True,
                                                        blocking_reads=True, range_streams=True)
    option_names = OPTIONS

    def __init__(
        self,
        origin: str,
        *,
        config: CommonConfig | None = None,
        credentials: HTTPCredentials | None = None,
        allow_private_redirects: bool = False,
    ) -> None:
        self._origin = origin.rstrip("/")
        self._config = config or split_options({})[0]
        self._creds = credentials or HTTPCredentials()
        self._allow_private = bool(allow_private_redirects)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._ssl: ssl.SSLContext | None = None
        self._pool: ConnectionPool | None = None
        self._pool_lock = threading.Lock()
        if self._creds.insecure:
            msg = (f"TLS certificate verification is disabled (insecure=True) for "
                   f"{self._origin}; anyone on the path can read or alter the data")
            warnings.warn(msg, InsecureTLSWarning, stacklevel=4)
            log.warning(msg)

    @classmethod
    def from_uri(cls, uri: Any, *, config: CommonConfig | None = None,
                 **options: Any) -> HTTPProvider:
        unknown = set(options) - cls.option_names
        if unknown:
            raise ConfigurationError(f"unknown HTTP option(s): {', '.join(sorted(unknown))}")
        allow_private = options.pop("allow_private_redirects", False)
        creds = resolve_http_credentials(uri, **options)
        return cls(f"{uri.scheme}://{uri.netloc}", config=config, credentials=creds,
                   allow_private_redirects=allow_private)

    def __repr__(self) -> str:
        return f"HTTPProvider({self._origin!r}, credentials={self._creds!r})"

    def __reduce__(self) -> Any:
        raise TypeError("HTTPProvider cannot be pickled; pass the URI and options instead")

    # -- session --------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            c = self._creds
            ctx = ssl.create_default_context(cafile=c.ca_bundle.value if c.ca_bundle else None)
            if c.client_cert is not None:
                ctx.load_cert_chain(c.client_cert.value,
                                    c.client_key.value if c.client_key else None)
            if c.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        return self._ssl

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and not self._session.closed and self._session_loop is loop:
            return self._session
        # First use, or used from another loop (e.g. after fork): a session is bound
        # to the loop that created it, so start a fresh one here.
        t = self._config.timeouts
        connector = aiohttp.TCPConnector(
            limit=self._config.transfer.concurrency + 4, ssl=self._ssl_context(),
            ttl_dns_cache=60,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # sock_connect: TCP+TLS set-up; sock_read: idle time between bytes.
            # No total timeout, and none on waiting for a pooled connection.
            timeout=aiohttp.ClientTimeout(total=None, connect=None,
                                          sock_connect=t.connect, sock_read=t.idle),
            auto_decompress=False,
            read_bufsize=_READ_BUFSIZE,
            skip_auto_headers=("Accept-Encoding",),
        )
        self._session_loop = loop
        return self._session

    def _blocking_pool(self) -> ConnectionPool:
        with self._pool_lock:
            if self._pool is None:
                c = self._creds
                tls = TLSSettings(
                    ca_bundle=c.ca_bundle.value if c.ca_bundle else None,
                    insecure=c.insecure,
                    client_cert=c.client_cert.value if c.client_cert else None,
                    client_key=c.client_key.value if c.client_key else None,
                )
                self._pool = ConnectionPool(tls, max_idle=self._config.transfer.concurrency + 4)
            return self._pool

    async def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            if self._session_loop is asyncio.get_running_loop():
                await session.close()
            else:  # its loop is gone or elsewhere; let it be collected there
                session.detach()

    # -- requests -------------------------------------------------------------
    async def _check_redirect_target(self, url: URL, path: str) -> None:
        if self._allow_private or not url.host:
            return
        addresses = [url.host]
        if not is_metadata_address(url.host):
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    url.host, url.port, type=socket.SOCK_STREAM)
                addresses += [str(i[4][0]) for i in infos]
            except OSError:
                pass  # unresolvable: the request itself will fail and say so
        refuse_metadata_target(addresses, path=path)

    @contextlib.asynccontextmanager
    async def _send(self, method: str, path: str,
                    headers: dict[str, str]) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request, following up to MAX_REDIRECTS redirects by hand."""
        session = self._get_session()
        url = URL(self._origin + path, encoded=True)  # never re-encode signed URLs
        creds = self._creds.auth_headers()
        for _ in range(MAX_REDIRECTS + 1):
            resp = await session.request(method, url, headers={**headers, **creds},
                                         allow_redirects=False)
            location = resp.headers.get("Location")
            if resp.status not in _REDIRECT_STATUSES or not location:
                try:
                    yield resp
                finally:
                    resp.release()
                return
            resp.release()
            target, same_origin = redirect_step(url, location, path=path)
            if not same_origin:
                creds = {}  # never forward credentials to another origin (or to http)
            await self._check_redirect_target(target, path)
            log.debug("%s %s redirected to %s", method, redact(str(url)), redact(str(target)))
            url = target
        raise ProtocolError(f"more than {MAX_REDIRECTS} redirects", service="http",
                            path=_redact_path(path))

    # -- stat -----------------------------------------------------------------
    async def stat(self, path: str) -> ObjectInfo:
        try:
            async with self._send("HEAD", path, dict(_IDENTITY)) as resp:
                info = self._info_from_head(resp, path)
            if info is None:
                probe = {**_IDENTITY, "Range": "bytes=0-0"}
                async with self._send("GET", path, probe) as resp:
                    info = self._info_from_probe(resp, path)
        except TensorstreamError:
            raise
        except _TRANSPORT_ERRORS as exc:
            raise _map_error(exc, path) from exc
        return info

    @staticmethod
    def _info(resp: aiohttp.ClientResponse, path: str, size: int) -> ObjectInfo:
        return ObjectInfo(path=path, size=size, etag=resp.headers.get("ETag"),
                          mtime=parse_http_date(resp.headers.get("Last-Modified")))

    def _info_from_head(self, resp: aiohttp.ClientResponse, path: str) -> ObjectInfo | None:
        """Info from a HEAD answer, or ``None`` when only a GET probe can tell."""
        if resp.status in (403, 405, 501) or (resp.status == 400):
            return None  # e.g. a presigned URL signed for GET only
        if resp.status != 200:
            raise _map_error(resp, path)
        length = resp.headers.get("Content-Length")
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if length is None or not length.isdigit() or encoding not in ("", "identity"):
            return None
        return self._info(resp, path, int(length))

    def _info_from_probe(self, resp: aiohttp.ClientResponse, path: str) -> ObjectInfo:
        if resp.status == 206:
            cr = parse_content_range(resp.headers.get("Content-Range"))
            if cr is None or cr.total is None:
                raise ProtocolError("206 without a usable Content-Range total",
                                    service="http", path=_redact_path(path))
            return self._info(resp, path, cr.total)
        if resp.status == 416:  # an empty object answers bytes=0-0 with 416 */0
            cr = parse_content_range(resp.headers.get("Content-Range"))
            if cr is not None and cr.total is not None:
                return self._info(resp, path, cr.total)
        if resp.status == 200:
            length = resp.headers.get("Content-Length")
            encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            if length is not None and length.isdigit() and encoding in ("", "identity"):
                return self._info(resp, path, int(length))
            raise ProtocolError("cannot tell the object's size (no Content-Length)",
                                service="http", path=_redact_path(path))
        raise _map_error(resp, path)

    # -- read -----------------------------------------------------------------
    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        want = len(buffer)
        if want == 0:
            return 0
        if offset < 0:
            raise InvalidRangeError(f"negative offset {offset}", service="http",
                                    path=_redact_path(path))
        last = offset + want - 1
        headers = {**_IDENTITY, "Range": f"bytes={offset}-{last}"}
        if etag and not etag.startswith("W/"):  # If-Match needs a strong ETag
            headers["If-Match"] = etag
        received = 0
        served: str | None = None
        try:
            async with self._send("GET", path, headers) as resp:
                self._check_ranged_response(resp, path, offset, last, etag)
                served = resp.headers.get("ETag")
                content = resp.content
                while received < want:
                    chunk = await content.readany()
                    if not chunk:
                        raise IncompleteReadError(
                            f"body ended after {received} of {want} bytes",
                            received=received, service="http", path=_redact_path(path))
                    n = min(len(chunk), want - received)
                    copy_into(buffer[received : received + n],
                              chunk if n == len(chunk) else memoryview(chunk)[:n])
                    received += n
                    if n < len(chunk):
                        raise ProtocolError("the server sent more bytes than the range",
                                            service="http", path=_redact_path(path))
        except TensorstreamError as exc:
            note_etag(exc, served)
            raise
        except _TRANSPORT_ERRORS as exc:
            raise note_etag(_map_error(exc, path, received=received), served) from exc
        return want

    def open_range_blocking(
        self, path: str, start: int, end: int, *, etag: str | None = None
    ) -> RangeBody:
        """One GET of ``[start, end)`` whose body is read in order (thread-safe)."""
        try:
            return open_range(
                self._blocking_pool(), self._origin + path, start, end, _IDENTITY, etag,
                self._config.timeouts, path=path,
                redirects=RedirectPolicy(self._creds.auth_headers(), self._allow_private,
                                         MAX_REDIRECTS),
            )
        except ssl.SSLError as exc:  # e.g. an unreadable client certificate
            raise _map_error(exc, path) from exc

    @staticmethod
    def _check_ranged_response(resp: aiohttp.ClientResponse, path: str, first: int,
                               last: int, etag: str | None) -> None:
        check_ranged_response(resp.status, resp.headers, first=first, last=last, etag=etag,
                              path=path, on_status=lambda: _map_error(resp, path))
