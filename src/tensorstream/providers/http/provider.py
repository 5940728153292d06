"""HTTP(S) provider: ranged GETs that either return exactly the bytes asked
for or raise, on the one HTTP data plane (:mod:`.._http.range_get`).

* ``stat``: ``HEAD`` for size / ETag / Last-Modified, falling back to a
  ``GET Range: bytes=0-0`` (presigned URLs are often signed for GET only).
* Reads: one ranged GET received straight into the caller's buffer
  (``open_range_blocking`` / ``readinto_blocking`` in the calling thread;
  async ``readinto`` and ``stat`` run the same code on worker threads). The
  answer must be ``206`` with exactly the requested ``Content-Range`` and no
  ``Content-Encoding``; a server that ignores ``Range`` never yields wrong
  bytes. Pinned reads send ``If-Match`` (or, without an ETag,
  ``If-Unmodified-Since``) and compare what each answer reports: its ETag (or
  Last-Modified) and its ``Content-Range`` total; an answer with no validator
  at all is confirmed by a HEAD after its body.
* Redirects are followed by hand: credential headers are dropped when the
  origin changes or https is downgraded, and link-local / metadata addresses
  are refused unless ``allow_private_redirects=True``.

Read-only: capabilities are ``read`` and ``stat``. Retries, resume and error
context live in :mod:`tensorstream.layers.stack`. See ``docs/http.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..._log_redaction import register_query_secrets
from ...config import CommonConfig, split_options
from ...errors import (
    ConfigurationError,
    InvalidRangeError,
    PermissionDeniedError,
    ProtocolError,
)
from ...uri import redact_text
from .._http.headers import (
    DROPPED_NOTE,
    exception_error,
    parse_content_range,
    parse_decimal,
    parse_http_date,
    redact_path,
    status_error,
    wire_target,
)
from .._http.proxies import ProxySettings, resolve_proxies
from .._http.range_get import (
    Answer,
    Cancel,
    ConnectionPool,
    RangeBody,
    RedirectPolicy,
    TLSSettings,
    in_thread,
    open_range,
    open_whole,
    request,
)
from ..base import Capabilities, ObjectInfo, Pin, Provider
from .config import LOOKED_IN, OPTIONS, HTTPCredentials, resolve_http_credentials

__all__ = ["HTTPProvider", "InsecureTLSWarning", "MAX_REDIRECTS"]

log = logging.getLogger("tensorstream.http")
#: Objects already warned of as having no validator (one warning per process).
_WARNED_UNVERSIONED: set[str] = set()
_NO_VALIDATOR = (
    "the server sends neither ETag nor Last-Modified, so a read can tell a replaced object "
    "only by its size: one replaced by an object of the same size while it is read may be "
    "read as a mix of both (nginx, Apache, S3 and CDNs send ETags)")
# A weak ETag names a class of equivalent representations, not one sequence of bytes.
_WEAK_ONLY = (
    "the server sends only a weak ETag (W/\"...\") and no Last-Modified: a weak ETag says two "
    "versions are equivalent, not the same bytes, so one replaced under the same weak ETag "
    "while it is read may be read as a mix of both (a strong ETag or a Last-Modified tells)")

MAX_REDIRECTS = 5
from ...errors import InsecureTLSWarning  # noqa: E402  (re-exported for compatibility)

_IDENTITY = {"Accept-Encoding": "identity"}

#: Every provider of this process (weak): a forked child gives each a new lock for
#: its pool (a thread of the parent, which does not exist there, may have held it).
_providers: weakref.WeakSet[HTTPProvider] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for provider in list(_providers):
        provider._pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _redact_path(path: str) -> str:
    return redact_path(path)


class HTTPProvider(Provider):
    """Objects behind one HTTP(S) origin, addressed by ``/path?query``.

    >>> async with tensorstream.get_provider("https://host/m.tensors", token="...") as p:
    ...     info = await p.stat("/m.tensors")  # doctest: +SKIP
    """

    def shown_path(self, path: str) -> str:
        """``/path?query`` with every query value hidden, whatever its name (a token
        travels under any name); the shared layers show a path this way."""
        return _redact_path(path)

    schemes = ("http", "https")
    service = "http"
    capabilities: ClassVar[Capabilities] = Capabilities(pinned_reads=True, blocking_reads=True,
                                                        range_streams=True)
    option_names = OPTIONS
    unsupported_advice = {
        "list": "HTTP(S) servers cannot be listed through tensorstream (HTTP has no listing "
                "servers agree on): name each object by its URL (cp, cat, load), or list the "
                "store the server serves them from (s3://, a local path)",
        "write": "HTTP(S) servers cannot be written to through tensorstream (HTTP has no "
                 "upload servers agree on): write to S3 (s3://), Redis (redis://) or a local "
                 "path, or upload with the server's own tools",
        "delete": "HTTP(S) servers cannot delete through tensorstream: delete it on the "
                  "server itself (its own tools), or where its files are kept",
    }

    def __init__(
        self,
        origin: str,
        *,
        config: CommonConfig | None = None,
        credentials: HTTPCredentials | None = None,
        allow_private_redirects: bool = False,
        proxies: ProxySettings | None = None,
    ) -> None:
        self._origin = origin.rstrip("/")
        self.shown_origin = _host_port(self._origin)
        #: The proxies of its requests (``proxy=`` option, else the environment's).
        self._proxies = proxies if proxies is not None else resolve_proxies()
        self._config = config or split_options({})[0]
        self._creds = credentials or HTTPCredentials()
        self._allow_private = bool(allow_private_redirects)
        self._pool: ConnectionPool | None = None
        self._pool_lock = threading.Lock()
        _providers.add(self)
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
        proxies = resolve_proxies(options.pop("proxy", None))
        creds = resolve_http_credentials(uri, **options)
        return cls(f"{uri.scheme}://{uri.netloc}", config=config, credentials=creds,
                   allow_private_redirects=allow_private, proxies=proxies)

    def __repr__(self) -> str:
        return f"HTTPProvider({self._origin!r}, credentials={self._creds!r})"

    def __reduce__(self) -> Any:
        raise TypeError("HTTPProvider cannot be pickled; pass the URI and options instead")

    # -- connections ----------------------------------------------------------
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
                self._pool = ConnectionPool(tls, max_idle=self._config.transfer.concurrency + 4,
                                            proxies=self._proxies)
            return self._pool

    async def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- requests -------------------------------------------------------------
    def _redirects(self) -> RedirectPolicy:
        return RedirectPolicy(self._creds.auth_headers(), self._allow_private, MAX_REDIRECTS)

    @contextlib.contextmanager
    def _naming_credentials(self) -> Iterator[None]:
        """A refusal (401/403) says which credentials were sent, or where none were
        found."""
        try:
            yield
        except PermissionDeniedError as exc:
            auth = self._creds.authorization
            if auth is not None and DROPPED_NOTE in exc.message:
                note = f"the Authorization from {auth.source} was sent to the first origin only"
            elif auth is not None:
                note = f"sent the Authorization from {auth.source}"
            elif self._creds.withheld is not None:
                note = f"sent no Authorization ({self._creds.withheld})"
            else:
                note = f"sent no Authorization (looked in: {', '.join(LOOKED_IN)})"
            if note not in exc.message:
                exc.message = f"{exc.message}; {note}"
                exc.args = (exc.message,)
            raise

    def _url(self, path: str) -> str:
        """The URL a request for ``path`` is sent to. The values of its query parameters
        (a presigned URL's signature, a token under any name: ``?hmac=``) are remembered
        as secrets: a server may echo one alone in its answer (its reason phrase), where
        no name says so."""
        register_query_secrets(path)
        return self._origin + wire_target(path)

    def _request(self, method: str, path: str, headers: dict[str, str],
                 cancel: Cancel | None = None) -> Answer:
        try:
            return request(self._blocking_pool(), self._url(path), method, headers,
                           self._config.timeouts, path=path, redirects=self._redirects(),
                           cancel=cancel)
        except ssl.SSLError as exc:  # e.g. an unreadable client certificate
            raise exception_error(exc, path=path) from exc

    # -- stat -----------------------------------------------------------------
    async def stat(self, path: str) -> ObjectInfo:
        return await in_thread(lambda: self.stat_blocking(path))

    def stat_blocking(self, path: str, cancel: Cancel | None = None) -> ObjectInfo:
        """:meth:`stat` in the calling thread."""
        with self._naming_credentials():
            info = self._info_from_head(self._request("HEAD", path, dict(_IDENTITY), cancel),
                                        path)
            probe = {**_IDENTITY, "Range": "bytes=0-0"}
            if info is None:
                info = self._info_from_probe(self._request("GET", path, probe, cancel), path)
            elif info.size == 0:
                # An empty object is read without a GET, so no answer would ever
                # contradict a HEAD that says 0 (a gateway or app answering HEAD
                # with "Content-Length: 0"): every read gave b"". One GET of the
                # first byte tells; only a size it reports is taken.
                info = self._confirm_empty(info, self._request("GET", path, probe, cancel))
        if info.etag is None and info.mtime is None:
            self._warn_unversioned(path, _NO_VALIDATOR)
        elif info.mtime is None and info.etag is not None and info.etag.strip().startswith("W/"):
            self._warn_unversioned(path, _WEAK_ONLY)
        return info

    def _warn_unversioned(self, path: str, why: str) -> None:
        """Say once per object and process that its reads cannot tell two versions apart."""
        where = f"{self._origin}{_redact_path(path.partition('?')[0])}"
        if where in _WARNED_UNVERSIONED:
            return
        _WARNED_UNVERSIONED.add(where)
        log.warning("%s: %s", redact_text(where), why)

    @staticmethod
    def _info(resp: Answer, path: str, size: int) -> ObjectInfo:
        return ObjectInfo(path=path, size=size, etag=resp.headers.get("ETag"),
                          mtime=parse_http_date(resp.headers.get("Last-Modified")))

    def _info_from_head(self, resp: Answer, path: str) -> ObjectInfo | None:
        """Info from a HEAD answer, or ``None`` when only a GET probe can tell."""
        if resp.status in (403, 405, 501) or (resp.status == 400):
            return None  # e.g. a presigned URL signed for GET only
        if resp.status != 200:
            raise status_error(resp.status, resp.reason, resp.headers, path=path)
        length = resp.headers.get("Content-Length")
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        size = parse_decimal(length)
        if size is None or encoding not in ("", "identity"):
            return None
        return self._info(resp, path, size)

    def _confirm_empty(self, info: ObjectInfo, resp: Answer) -> ObjectInfo:
        """``info`` (a HEAD's size 0), unless the GET of the first byte ``resp``
        reports the object holds bytes: its info then (the reads are checked
        against its total). Any other answer (416 ``*/0``, 416 alone, 200 with
        no body, an error status) leaves the HEAD's; a GET that serves a byte
        without saying how many there are is an error (never an empty read)."""
        if resp.status not in (200, 206):
            return info
        try:
            probed = self._info_from_probe(resp, info.path)
        except ProtocolError as exc:
            if resp.status == 206 or resp.body:
                raise ProtocolError(
                    f"HEAD says 0 bytes but a GET serves bytes, and {exc.message}",
                    service="http", path=_redact_path(info.path)) from None
            return info
        if probed.size > 0:
            log.warning("%s%s: HEAD says 0 bytes but a GET serves %d; reading what the GETs "
                        "serve", self.shown_origin or "", _redact_path(info.path.partition("?")[0]),
                        probed.size)
            return probed
        return info

    def _info_from_probe(self, resp: Answer, path: str) -> ObjectInfo:
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
            size = parse_decimal(length)
            if size is not None and encoding in ("", "identity"):
                return self._info(resp, path, size)
            raise ProtocolError("cannot tell the object's size (no Content-Length)",
                                service="http", path=_redact_path(path))
        raise status_error(resp.status, resp.reason, resp.headers, path=path, body=resp.body)

    # -- read -----------------------------------------------------------------
    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """One ranged GET received into ``buffer`` on a worker thread (the same
        request as :meth:`readinto_blocking`)."""
        if not len(buffer):
            return 0
        if offset < 0:
            raise InvalidRangeError(f"negative offset {offset}", service="http",
                                    path=_redact_path(path))
        return await in_thread(lambda: self._open(
            path, offset, offset + len(buffer), pin, None).readinto(buffer))

    def open_range_blocking(
        self, path: str, start: int, end: int, *, pin: Pin | None = None
    ) -> RangeBody:
        """One GET of ``[start, end)`` whose body is read in order (thread-safe)."""
        return self._open(path, start, end, pin, None)

    def open_whole_blocking(self, path: str) -> tuple[ObjectInfo, RangeBody] | None:
        """What :meth:`stat` reports and the body of every byte, from one GET
        (``Range: bytes=0-``); ``None`` when that answer cannot stand in for a
        ``HEAD`` (ask :meth:`stat`). Saves a load one round trip."""
        try:
            with self._naming_credentials():
                got = open_whole(self._blocking_pool(), self._url(path), _IDENTITY,
                                 self._config.timeouts, path=path, redirects=self._redirects())
        except ssl.SSLError as exc:  # e.g. an unreadable client certificate
            raise exception_error(exc, path=path) from exc
        if got is None:
            return None
        headers, body = got
        return ObjectInfo(path=path, size=body.end, etag=headers.get("ETag"),
                          mtime=parse_http_date(headers.get("Last-Modified"))), body

    def _open(self, path: str, start: int, end: int, pin: Pin | None,
              cancel: Cancel | None) -> RangeBody:
        def confirm() -> Pin:  # the version now, for an answer without validators
            return Pin.of(self.stat_blocking(path))

        try:
            with self._naming_credentials():
                return open_range(
                    self._blocking_pool(), self._url(path), start, end, _IDENTITY, pin,
                    self._config.timeouts, path=path, redirects=self._redirects(),
                    cancel=cancel, confirm=confirm)
        except ssl.SSLError as exc:  # e.g. an unreadable client certificate
            raise exception_error(exc, path=path) from exc


def _host_port(origin: str) -> str | None:
    """``host:port`` of ``origin`` (``scheme://[user@]host[:port]``), the port said even
    where it is the scheme's; never its user info."""
    try:
        parts = urlsplit(origin)
        host, port = parts.hostname, parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return None
    if not host or not port:
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
