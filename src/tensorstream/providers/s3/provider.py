"""S3 (and S3-compatible) provider.

Reads run on the one HTTP data plane (:mod:`.._http.range_get`): ``stat`` is
one signed HEAD, a read is one signed ranged GET pinned with ``If-Match``,
its answer checked like every HTTP answer (status, ``Content-Range`` with
total, ``Content-Length``, ``Content-Encoding``, ETag) and its body received
straight into the caller's buffer. ``open_range_blocking`` and
``readinto_blocking`` run in the calling thread; the async ``readinto`` and
``stat`` run the same code on worker threads. botocore is used for what it
is good at, never for moving read bytes: a plain synchronous client, built
from the resolved credentials, endpoint and settings (:mod:`.session`),
resolves the object's URL (endpoint rules, addressing style, key quoting;
cached per key, no secret in it) and botocore's ``S3SigV4Auth`` signs the
requests in ``Authorization`` headers (:mod:`.signing`: one signature
per object and method for a minute, a new one at once for rotated
credentials; header signing keeps credentials out of URLs). Error answers go
through the provider's one S3 error table (:mod:`.errors`).

Listing pages through ``ListObjectsV2`` with that same botocore client on a
worker thread. aiobotocore serves the writes: deletes and the multipart
writer (:class:`~tensorstream.providers.s3.writer.S3Writer`); its client is
only built when one of those is used. tensorstream's policy layer does
retries, so botocore's own retries are off (one attempt).

Paths are ``bucket/key``. See ``docs/s3.md``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import os
import ssl
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote, unquote_plus, urlencode
from xml.etree import ElementTree

from ..._client_cert import load_client_cert
from ..._gcpause import paused
from ..._log_redaction import install_secret_filter
from ...config import CommonConfig, split_options
from ...errors import (
    ConfigurationError,
    InsecureTLSWarning,
    InvalidRangeError,
    InvalidURIError,
    ProtocolError,
    TensorstreamError,
)
from ...uri import is_utf8, redact
from .._http.exchange import read_error_body
from .._http.headers import exception_error, parse_decimal, parse_http_date
from .._http.proxies import ProxySettings, resolve_proxies
from .._http.range_get import (
    Answer,
    Cancel,
    ConnectionPool,
    RangeBody,
    TLSSettings,
    in_thread,
    open_range,
    open_whole,
    request,
)
from ..base import Capabilities, ObjectInfo, Pin, Provider, Writer
from .config import (
    OPTIONS,
    S3Credentials,
    aws_files,
    chain_source,
    no_credentials_error,
    process_timeout,
    resolve_s3_credentials,
)
from .errors import (
    ErrorContext,
    WrongRegionError,
    from_credential_chain,
    map_s3_error,
    map_s3_http_error,
    map_session_error,
)
from .process import DEFAULT_CREDENTIAL_PROCESS_TIMEOUT, bound_credential_process
from .profile import config_file, config_profile_name
from .session import shared_data_loader
from .signing import PathStyle, SignedGets, StaticCredentials, path_style
from .writer import S3Writer

__all__ = ["S3Provider"]

_T = TypeVar("_T")

log = logging.getLogger("tensorstream.s3")
install_secret_filter()  # botocore DEBUG logs carry session tokens

_WRITE_MEMORY = 128 << 20
#: A ListObjectsV2 page (1000 keys of up to 1 KiB) fits well inside this.
# Real S3 may give a few empty truncated pages (deleted keys it skips); a run
# this long, each with a fresh token, is a server that would list forever.
_LIST_EMPTY_PAGES = 1000
_LIST_BODY_LIMIT = 8 << 20  # bound on bytes in in-flight upload parts
_CHECKSUM_MODES = ("when_supported", "when_required")
#: Where botocore sends requests without an endpoint (its proxy decision is made for it).
_AWS_ENDPOINT = "https://s3.amazonaws.com"


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    if not bucket or not key:
        raise InvalidURIError(f"S3 paths are bucket/key, got {path!r}")
    if not key.isascii() and not is_utf8(key):  # a local file name in another encoding
        raise InvalidURIError(f"S3 keys are UTF-8, {key!r} is not (a file name in "
                              "another encoding?)")
    return bucket, key


def _ca_source(path: str, profile: str | None) -> str:
    """Where botocore's configuration set the CA bundle ``path``, for messages."""
    if os.environ.get("AWS_CA_BUNDLE") == path:
        return "env AWS_CA_BUNDLE"
    name = config_profile_name(profile, os.environ)
    return f"{config_file(os.environ)} [profile {name}] ca_bundle"


def _default_region() -> str | None:
    """The region botocore would sign with when none is set, known without
    importing it: ``us-east-1`` when there is no AWS config file at all (the
    variables were already looked at). With a config file, ``None``: botocore
    reads it (a region, an endpoint or an addressing style may be there).
    Building a botocore client to find out costs ~0.1-0.3 s per process."""
    config = os.environ.get("AWS_CONFIG_FILE") or os.path.join("~", ".aws", "config")
    return None if os.path.lexists(os.path.expanduser(config)) else "us-east-1"


def _path(value: Any) -> str | None:
    return None if value is None else os.fspath(value)


class S3Provider(Provider):
    """Objects in S3 or an S3-compatible store, addressed as ``bucket/key``."""

    schemes = ("s3",)
    service = "s3"
    capabilities: ClassVar[Capabilities] = Capabilities(
        write=True, list=True, delete=True, pinned_reads=True, blocking_reads=True,
        range_streams=True,
    )
    option_names = OPTIONS

    def __init__(
        self,
        credentials: S3Credentials,
        config: CommonConfig,
        *,
        checksum: str = "when_supported",
        ca_bundle: str | None = None,
        insecure: bool = False,
        proxies: ProxySettings | None = None,
        process_timeout: float = DEFAULT_CREDENTIAL_PROCESS_TIMEOUT,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        if client_key is not None and client_cert is None:
            raise ConfigurationError("client_key needs client_cert")
        if client_cert is not None:  # (botocore loads it itself: an encrypted key
            # prompted on the terminal, a mismatched one was a retried "cannot reach")
            load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), client_cert, client_key)
        if checksum not in _CHECKSUM_MODES:
            raise ConfigurationError(
                f"s3_checksum must be one of {', '.join(_CHECKSUM_MODES)}, got {checksum!r}"
            )
        self.credentials = credentials
        self.config = config
        self.checksum = checksum
        self.ca_bundle = ca_bundle
        self.insecure = insecure
        #: The client certificate (and key) of mutual TLS, for reads and botocore alike.
        self.client_cert, self.client_key = client_cert, client_key
        #: Seconds a profile's credential_process may run before it is stopped.
        self.process_timeout = process_timeout
        #: The proxies of every request: its reads' and botocore's alike.
        self.proxies = proxies if proxies is not None else resolve_proxies()
        self._endpoint_proxy = self.proxies.for_url(
            credentials.endpoint.value if credentials.endpoint else _AWS_ENDPOINT)
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._key_source = credentials.key_source
        # The blocking path: a sync botocore client (signing only) and a pool.
        self._sync_lock = threading.Lock()
        self._sync_client: Any = None
        self._pool: ConnectionPool | None = None
        self._gets = SignedGets()  # object URLs and reusable signatures (blocking path)
        self._sync_creds: Any = None
        self._default_ca: str | None = None
        self._default_ca_source: str | None = None  # where botocore's configuration set it
        self._light: PathStyle | bool | None = None  # None: not decided yet
        #: Buckets S3 said are in another region than the configured one, and the
        #: clients signing for those regions.
        self._bucket_regions: dict[str, str] = {}
        self._region_clients: dict[str, Any] = {}

    @classmethod
    def from_uri(cls, uri: Any, *, config: CommonConfig | None = None, **options: Any) -> S3Provider:
        """Resolve credentials (levels 1-4 now, botocore's chain on first use)."""
        creds = resolve_s3_credentials(options)
        insecure = bool(options.get("insecure"))
        if insecure:
            where = creds.endpoint.value if creds.endpoint else "AWS S3"
            warnings.warn(f"insecure=True: TLS certificates of {redact(where)} are not verified",
                          InsecureTLSWarning, stacklevel=3)
            log.warning("TLS verification disabled for %s (insecure=True)", redact(where))
        return cls(
            creds,
            config or split_options({})[0],
            checksum=str(options.get("s3_checksum") or "when_supported"),
            ca_bundle=options.get("ca_bundle"),
            insecure=insecure,
            proxies=resolve_proxies(options.get("proxy")),
            process_timeout=process_timeout(options),
            client_cert=_path(options.get("client_cert")),
            client_key=_path(options.get("client_key")),
        )

    def __repr__(self) -> str:
        endpoint = self.credentials.endpoint.value if self.credentials.endpoint else "aws"
        return f"S3Provider(endpoint={redact(endpoint)!r}, credentials from {self._key_source})"

    def __reduce__(self) -> Any:
        raise TypeError("S3Provider holds credentials and cannot be pickled")

    # -- the client -------------------------------------------------------------
    def _ctx(self, path: str) -> ErrorContext:
        endpoint = self.credentials.endpoint.value if self.credentials.endpoint else "AWS S3"
        return ErrorContext(path=path, credential_source=self._key_source, endpoint=endpoint,
                            secrets=self._secrets(), region=self._signing_region(path),
                            proxy=self._endpoint_proxy)

    def _signing_region(self, path: str) -> str:
        """The region reads of ``path`` are signed for, as far as known without
        building a client."""
        if (region := self._bucket_regions.get(path.partition("/")[0])) is not None:
            return region
        if isinstance(self._light, PathStyle):
            return self._light.region
        client = self._sync_client
        if client is not None:
            return str(client.meta.region_name or "")
        return self.credentials.region.value if self.credentials.region else ""

    def _secrets(self) -> tuple[str, ...]:
        """The secret key and session token in use (to mask in server messages)."""
        creds = self.credentials
        found = [s.value for s in (creds.secret_access_key, creds.session_token) if s]
        if self._sync_creds is not None:  # botocore's chain: the keys it found
            try:
                frozen = self._sync_creds.get_frozen_credentials()
                found += [s for s in (frozen.secret_key, frozen.token) if s]
            except Exception:  # a refresh failing here must not hide the error being mapped
                pass
        return tuple(dict.fromkeys(found))

    async def _get_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._loop is not loop:
            # A client belongs to the loop that made it (e.g. after fork): start over.
            self._loop, self._lock, self._client, self._stack = loop, asyncio.Lock(), None, None
        assert self._lock is not None
        async with self._lock:
            if self._client is None:
                self._client = await self._create_client()
        return self._client

    def _session_error(self, exc: Exception, profile: str | None) -> BaseException:
        """Map an error from building a botocore session/client (async or sync alike)."""
        creds = self.credentials
        return map_session_error(exc, profile, aws_files(os.environ),
                                 creds.profile.source if creds.profile else "")

    async def _create_client(self) -> Any:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession

        creds = self.credentials
        profile = creds.profile.value if creds.profile else None
        try:
            session = AioSession(profile=profile)
            session.register_component("data_loader", shared_data_loader(session))
            if creds.uses_botocore_chain:
                bound_credential_process(session, self.process_timeout)
                found = await session.get_credentials()
                if found is None:
                    raise no_credentials_error(creds)
                self._key_source = chain_source(getattr(found, "method", None), profile)
        except Exception as exc:
            mapped = self._session_error(exc, profile)
            if mapped is exc:
                raise
            raise mapped from exc
        cfg_kwargs, kwargs = self._client_options()
        kwargs["config"] = AioConfig(**cfg_kwargs)
        stack = contextlib.AsyncExitStack()
        with paused():  # (botocore's S3 model: _gcpause)
            client = await stack.enter_async_context(session.create_client("s3", **kwargs))
        self._stack = stack
        return client

    def _client_options(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Config and ``create_client`` arguments shared by the async client and
        the blocking path's signing client."""
        import botocore

        creds = self.credentials
        t, x = self.config.timeouts, self.config.transfer
        cfg: dict[str, Any] = dict(
            connect_timeout=t.connect,
            read_timeout=t.idle,
            max_pool_connections=x.concurrency,
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": creds.addressing_style.value if creds.addressing_style
                else "auto"},
            signature_version=botocore.UNSIGNED if creds.anonymous else None,
            request_checksum_calculation=self.checksum,
            response_checksum_validation=self.checksum,
        )
        kwargs: dict[str, Any] = {}
        if creds.endpoint:
            kwargs["endpoint_url"] = creds.endpoint.value
        if creds.region:
            kwargs["region_name"] = creds.region.value
        if creds.access_key_id and creds.secret_access_key:
            kwargs["aws_access_key_id"] = creds.access_key_id.value
            kwargs["aws_secret_access_key"] = creds.secret_access_key.value
            if creds.session_token:
                kwargs["aws_session_token"] = creds.session_token.value
        # botocore's own decision (the environment, its NO_PROXY without CIDR) is
        # replaced by the data plane's, so listings and writes take the reads' route.
        cfg["proxies"] = self.proxies.botocore_proxies(
            creds.endpoint.value if creds.endpoint else _AWS_ENDPOINT)
        if self.insecure:
            kwargs["verify"] = False
        elif self.ca_bundle:
            kwargs["verify"] = str(self.ca_bundle)
        if self.client_cert is not None:
            cfg["client_cert"] = ((self.client_cert, self.client_key) if self.client_key
                                  else self.client_cert)
        return cfg, kwargs

    async def _call(self, op: str, path: str, **kwargs: Any) -> Any:
        client = await self._get_client()
        with self._mapped_errors(path):
            return await getattr(client, op)(**kwargs)

    @contextlib.contextmanager
    def _mapped_errors(self, path: str, received: int = 0) -> Iterator[None]:
        """Raise botocore/aiohttp errors of the block as tensorstream errors
        (``received`` bytes of a broken body were valid)."""
        try:
            yield
        except Exception as exc:
            if from_credential_chain(exc):
                # A refresh failed (credential_process, SSO, assume-role): its error
                # may quote what the process printed; mapped as at start-up.
                creds = self.credentials
                mapped = self._session_error(exc, creds.profile.value if creds.profile
                                             else None)
            else:
                mapped = map_s3_error(exc, self._ctx(path), received=received)
            if mapped is exc:
                raise
            raise mapped from exc

    # -- reads (the HTTP data plane) -----------------------------------------------
    async def stat(self, path: str) -> ObjectInfo:
        return await in_thread(lambda: self.stat_blocking(path))

    def stat_blocking(self, path: str, cancel: Cancel | None = None) -> ObjectInfo:
        """:meth:`stat` (one signed HEAD) in the calling thread."""
        return self._in_bucket_region(path, lambda: self._stat_once(path, cancel))

    def _stat_once(self, path: str, cancel: Cancel | None) -> ObjectInfo:
        bucket, key = _split(path)
        client, pool = self._reads_for(bucket)
        with self._mapped_errors(path):  # signing may refresh the credentials
            url = self._gets.object_url(client, bucket, key)
            signed = self._gets.signed_headers(self._sync_creds, client, url,
                                               {"Accept-Encoding": "identity"}, method="HEAD")
        try:
            answer = request(pool, url, "HEAD", signed, self.config.timeouts, path=path,
                             service="s3", cancel=cancel)
        except TensorstreamError:
            raise
        except ssl.SSLError as exc:
            raise exception_error(exc, path=path, service="s3") from exc
        if answer.status != 200:
            err = map_s3_http_error(answer.status, answer.headers, answer.body, self._ctx(path))
            if answer.status == 400 and not answer.body and not isinstance(err,
                                                                          WrongRegionError):
                err = self._reason_for_400(client, pool, url, path, cancel) or err
            raise err
        return _head_info(path, answer)

    def _reason_for_400(self, client: Any, pool: ConnectionPool, url: str, path: str,
                        cancel: Cancel | None) -> TensorstreamError | None:
        """The error S3 gives a GET of byte 0, for a HEAD answered with a bare 400.

        S3 answers a HEAD without a body: an expired session token, an SSE-C object
        read without its key and a malformed request were all "S3 rejected the
        request (400)", the source of the keys unnamed. The GET's XML ``Code`` says
        which (``None``: it says nothing more either)."""
        try:
            with self._mapped_errors(path):
                signed = self._gets.signed_headers(
                    self._sync_creds, client, url,
                    {"Accept-Encoding": "identity", "Range": "bytes=0-0"})
            answer = request(pool, url, "GET", signed, self.config.timeouts, path=path,
                             service="s3", cancel=cancel)
        except (TensorstreamError, OSError):
            return None
        if answer.status < 400 or not answer.body:
            return None
        return map_s3_http_error(answer.status, answer.headers, answer.body, self._ctx(path))

    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """One signed ranged GET received into ``buffer`` on a worker thread (the
        same request as :meth:`readinto_blocking`)."""
        if offset < 0:
            raise InvalidRangeError(f"negative offset {offset}")
        if not len(buffer):
            return 0
        return await in_thread(lambda: self._open(
            path, offset, offset + len(buffer), pin, None).readinto(buffer))

    # -- the blocking path ----------------------------------------------------------
    def _create_sync_client(self, region: str | None = None) -> Any:
        """A synchronous botocore client used only to presign (no requests), for
        ``region`` (else the configured one)."""
        import botocore.exceptions
        import botocore.session
        from botocore.config import Config

        creds = self.credentials
        profile = creds.profile.value if creds.profile else None
        try:
            session = botocore.session.Session(profile=profile)
            session.register_component("data_loader", shared_data_loader(session))
            if creds.anonymous:
                self._sync_creds = None
            elif creds.access_key_id and creds.secret_access_key:
                from botocore.credentials import Credentials

                self._sync_creds = Credentials(
                    creds.access_key_id.value, creds.secret_access_key.value,
                    creds.session_token.value if creds.session_token else None)
            else:  # botocore's chain (refreshable credentials refresh themselves)
                bound_credential_process(session, self.process_timeout)
                self._sync_creds = session.get_credentials()
                if self._sync_creds is None:
                    raise no_credentials_error(creds)
                self._key_source = chain_source(getattr(self._sync_creds, "method", None),
                                                profile)
            cfg_kwargs, kwargs = self._client_options()
            if region is not None:
                kwargs["region_name"] = region
            if cfg_kwargs["signature_version"] is None:
                cfg_kwargs["signature_version"] = "s3v4"  # presign with SigV4, never SigV2
            kwargs["config"] = Config(**cfg_kwargs)
            with paused():
                client = session.create_client("s3", **kwargs)
            if not self.insecure and not self.ca_bundle:
                # botocore's own trust store (AWS_CA_BUNDLE / profile / certifi)
                configured = session.get_config_variable("ca_bundle")
                self._default_ca = configured or _certifi()
                self._default_ca_source = _ca_source(configured, profile) if configured else None
        except Exception as exc:
            mapped = self._session_error(exc, profile)
            if mapped is exc:
                raise
            raise mapped from exc
        return client

    def _light_addressing(self) -> PathStyle | None:
        """Reads without a botocore client, where nothing else is needed: static
        keys (or anonymous), a custom endpoint addressed path-style, a known region,
        and a trust store that does not come from botocore's configuration."""
        creds = self.credentials
        static = creds.anonymous or (creds.access_key_id is not None
                                     and creds.secret_access_key is not None)
        if not static or creds.profile is not None:
            return None
        endpoint = creds.endpoint.value if creds.endpoint else None
        if endpoint and endpoint.startswith("https:") and not (self.ca_bundle or self.insecure):
            return None  # botocore's trust store (AWS_CA_BUNDLE, profile, certifi) applies
        light = path_style(endpoint, creds.addressing_style.value if creds.addressing_style
                           else None, creds.region.value if creds.region else _default_region())
        if light is not None and not creds.anonymous:
            assert creds.access_key_id is not None and creds.secret_access_key is not None
            self._sync_creds = StaticCredentials(
                creds.access_key_id.value, creds.secret_access_key.value,
                creds.session_token.value if creds.session_token else None)
        return light

    def _reads_state(self) -> tuple[Any, ConnectionPool]:
        """What reads need: a botocore client (or a :class:`PathStyle`) and the pool."""
        with self._sync_lock:
            if self._light is None and self._sync_client is None:
                self._light = self._light_addressing() or False
            if self._light:
                return self._light, self._pool_locked()
        return self._blocking_state()

    def _blocking_state(self) -> tuple[Any, ConnectionPool]:
        with self._sync_lock:
            if self._sync_client is None:
                self._sync_client = self._create_sync_client()
            return self._sync_client, self._pool_locked()

    def _reads_for(self, bucket: str) -> tuple[Any, ConnectionPool]:
        """:meth:`_reads_state` for ``bucket``: signed for the region S3 said it is in."""
        client, pool = self._reads_state()
        region = self._bucket_regions.get(bucket)
        if region is None:
            return client, pool
        if isinstance(client, PathStyle):
            return dataclasses.replace(client, region=region), pool
        with self._sync_lock:
            other = self._region_clients.get(region)
            if other is None:
                other = self._region_clients[region] = self._create_sync_client(region)
        return other, pool

    def _in_bucket_region(self, path: str, call: Callable[[], _T]) -> _T:
        """``call()``, sent once more in the bucket's region when S3 answers that the
        bucket is in another one (a 301 ``PermanentRedirect``, a 400
        ``AuthorizationHeaderMalformed``): boto3 follows such an answer, and a
        bucket outside the configured region (``us-east-1`` by default) was an
        error before. Remembered per bucket; writes and deletes go through
        botocore, whose own redirector follows it."""
        try:
            return call()
        except WrongRegionError as exc:
            bucket = path.partition("/")[0]
            if not exc.region or self._bucket_regions.get(bucket) == exc.region:
                raise
            log.info("S3 bucket %r is in region %s: its reads are signed for it", bucket,
                     exc.region)
            self._bucket_regions[bucket] = exc.region
        return call()

    def _pool_locked(self) -> ConnectionPool:
        if self._pool is None:
            tls = TLSSettings(ca_bundle=str(self.ca_bundle) if self.ca_bundle
                              else self._default_ca, insecure=self.insecure,
                              client_cert=self.client_cert, client_key=self.client_key)
            if self._default_ca_source is not None and not self.ca_bundle:
                try:  # loaded once more here, so that the error names where it was set
                    tls.context()
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{exc} (set by {self._default_ca_source})") from None
            self._pool = ConnectionPool(tls, max_idle=self.config.transfer.concurrency + 4,
                                        proxies=self.proxies)
        return self._pool

    def open_range_blocking(
        self, path: str, start: int, end: int, *, pin: Pin | None = None
    ) -> RangeBody:
        """One signed GET of ``[start, end)`` whose body is read in order (thread-safe)."""
        return self._open(path, start, end, pin, None)

    def _open(self, path: str, start: int, end: int, pin: Pin | None,
              cancel: Cancel | None) -> RangeBody:
        return self._in_bucket_region(path, lambda: self._open_once(path, start, end, pin,
                                                                    cancel))

    def _open_once(self, path: str, start: int, end: int, pin: Pin | None,
                   cancel: Cancel | None) -> RangeBody:
        bucket, key = _split(path)
        client, pool = self._reads_for(bucket)
        with self._mapped_errors(path):  # signing may refresh the credentials
            url = self._gets.object_url(client, bucket, key)
            signed = self._gets.signed_headers(self._sync_creds, client, url,
                                               {"Accept-Encoding": "identity"})
        ctx = self._ctx(path)

        def on_status(resp: Any, _where: str) -> Any:
            return map_s3_http_error(resp.status, resp.headers, read_error_body(resp), ctx)

        def confirm() -> Pin:  # the version now, for an answer without validators
            return Pin.of(self.stat_blocking(path))

        try:
            return open_range(pool, url, start, end, signed, pin, self.config.timeouts,
                              path=path, service="s3", on_status=on_status, cancel=cancel,
                              confirm=confirm)
        except ssl.SSLError as exc:
            raise exception_error(exc, path=path, service="s3") from exc

    def open_whole_blocking(self, path: str) -> tuple[ObjectInfo, RangeBody] | None:
        """What :meth:`stat` reports and the body of every byte, from one signed
        GET (``Range: bytes=0-``); ``None`` when that answer cannot stand in for
        the ``HEAD`` (ask :meth:`stat`). Saves a load one round trip."""
        return self._in_bucket_region(path, lambda: self._open_whole_once(path))

    def _open_whole_once(self, path: str) -> tuple[ObjectInfo, RangeBody] | None:
        bucket, key = _split(path)
        client, pool = self._reads_for(bucket)
        with self._mapped_errors(path):  # signing may refresh the credentials
            url = self._gets.object_url(client, bucket, key)
            signed = self._gets.signed_headers(self._sync_creds, client, url,
                                               {"Accept-Encoding": "identity"})
        ctx = self._ctx(path)

        def on_status(resp: Any, _where: str) -> Any:
            return map_s3_http_error(resp.status, resp.headers, read_error_body(resp), ctx)

        try:
            got = open_whole(pool, url, signed, self.config.timeouts, path=path, service="s3",
                             on_status=on_status)
        except ssl.SSLError as exc:
            raise exception_error(exc, path=path, service="s3") from exc
        if got is None:
            return None
        h, body = got
        return ObjectInfo(path=path, size=body.end, etag=h.get("ETag"),
                          mtime=parse_http_date(h.get("Last-Modified")),
                          version=h.get("x-amz-version-id"),
                          extra={"content_type": h.get("Content-Type")}), body

    # -- list / delete ------------------------------------------------------------
    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        """Objects under ``bucket/prefix``, in key order (S3 lists in UTF-8 order).

        Directory-marker keys (ending in ``/``) are skipped.
        """
        async for info in self._list(prefix, None):
            yield info

    async def list_level(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """One level under ``bucket/prefix``, in key order, as ``aws s3 ls`` lists it
        (``Delimiter=/``): the objects there, and each deeper prefix once as an entry
        whose path ends in ``/`` (size 0) -- not every key below it."""
        async for info in self._list(prefix, "/"):
            yield info

    async def _list(self, prefix: str, delimiter: str | None) -> AsyncIterator[ObjectInfo]:
        bucket, _, key_prefix = prefix.partition("/")
        if not bucket:
            raise InvalidURIError(f"S3 list prefixes are bucket[/prefix], got {prefix!r}")
        # Pages are fetched on a worker thread: where reads need no botocore
        # client, one signed GET each on the data plane; otherwise the reads'
        # botocore client (never aiobotocore: a cp -r builds one client and
        # never loads aiohttp). Pages follow the continuation token (botocore's
        # paginator would first scan its data directories: ~0.1 s of CPU).
        args = {"Bucket": bucket, "Prefix": key_prefix}
        if delimiter:
            args["Delimiter"] = delimiter

        def page_once() -> Any:
            client, pool = self._reads_for(bucket)
            if isinstance(client, PathStyle):
                return self._list_page(client, pool, prefix, args)
            with self._mapped_errors(prefix):
                return client.list_objects_v2(**args)

        def next_page() -> Any:
            return self._in_bucket_region(prefix, page_once)

        tokens: set[str] = set()
        empty = 0  # consecutive truncated pages without an entry
        while True:
            page = await in_thread(next_page)
            contents = page.get("Contents", ())
            # (a page's deeper prefixes, merged into its keys' order; pages come in order)
            below = [{"Key": str(p["Prefix"]), "Size": 0, "Prefix": True}
                     for p in page.get("CommonPrefixes") or () if p.get("Prefix")]
            for obj in sorted([*contents, *below], key=lambda o: str(o["Key"])) if below \
                    else contents:
                if obj.get("Prefix"):
                    yield ObjectInfo(path=f"{bucket}/{obj['Key']}", size=0)
                    continue
                size = int(obj["Size"])
                if size < 0:
                    key = str(obj["Key"])[:100]
                    raise ProtocolError(f"the listing gives key {key!r} a negative size ({size})",
                                        service="s3", path=redact(prefix))
                if obj["Key"].endswith("/") and not size:
                    continue  # a folder marker; one holding bytes is listed (cp reports it)
                yield ObjectInfo(
                    path=f"{bucket}/{obj['Key']}",
                    size=size,
                    etag=obj.get("ETag"),
                    mtime=obj.get("LastModified"),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated"):
                break
            if not token:
                # Ending here would pass a part of the listing off as all of it (and
                # sync --delete would remove what the rest holds).
                raise ProtocolError("the listing is truncated but gives no continuation "
                                    "token to list the rest", service="s3",
                                    path=redact(prefix))
            if token in tokens:
                # A server answering the same page forever: listing on would never end.
                raise ProtocolError("the listing loops: the server gave a continuation token "
                                    "it had given before", service="s3", path=redact(prefix))
            empty = 0 if contents or below else empty + 1
            if empty >= _LIST_EMPTY_PAGES:
                raise ProtocolError(f"the listing gave {empty} truncated "
                                    "pages in a row without an entry, each with a new "
                                    "continuation token; it would never end", service="s3",
                                    path=redact(prefix))
            tokens.add(token)
            args["ContinuationToken"] = token

    def _list_page(self, light: PathStyle, pool: ConnectionPool, prefix: str,
                   args: dict[str, str]) -> dict[str, Any]:
        """One ``ListObjectsV2`` page as botocore would return it (the fields
        :meth:`list` reads), by a signed GET on the data plane."""
        query = {"list-type": "2", "prefix": args["Prefix"], "encoding-type": "url"}
        if "Delimiter" in args:
            query["delimiter"] = args["Delimiter"]
        if "ContinuationToken" in args:
            query["continuation-token"] = args["ContinuationToken"]
        url = (f"{light.endpoint}/{quote(args['Bucket'], safe='')}?"
               + urlencode(sorted(query.items()), quote_via=quote, safe="-_.~"))
        signed = self._gets.signed_headers(self._sync_creds, light, url,
                                           {"Accept-Encoding": "identity"})
        answer = request(pool, url, "GET", signed, self.config.timeouts, path=prefix,
                         service="s3", body_limit=_LIST_BODY_LIMIT)
        if answer.status != 200:
            raise map_s3_http_error(answer.status, answer.headers, answer.body,
                                    self._ctx(prefix))
        if not answer.complete:
            raise ProtocolError(f"a ListObjectsV2 page larger than {_LIST_BODY_LIMIT} bytes",
                                service="s3", path=redact(prefix))
        return parse_list_page(answer.body, prefix)

    async def list_buckets(self) -> builtins.list[tuple[str, Any]]:
        """``[(bucket name, creation time)]`` the credentials can see (``tensorstream ls s3://``)."""
        resp = await self._call("list_buckets", "")
        buckets = resp.get("Buckets", ())
        if not all(b.get("Name") for b in buckets):  # (botocore leaves out what the XML lacks)
            raise ProtocolError("the ListBuckets answer lists a bucket without a name",
                                service="s3", path="")
        return [(b["Name"], b.get("CreationDate")) for b in buckets]

    async def delete(self, path: str) -> None:
        bucket, key = _split(path)
        await self._call("head_object", path, Bucket=bucket, Key=key)  # NotFoundError if absent
        await self._call("delete_object", path, Bucket=bucket, Key=key)

    # -- writes -------------------------------------------------------------------
    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        bucket, key = _split(path)
        x = self.config.transfer
        part_size = max(x.part_size, 5 << 20)

        async def call(op: str, **kw: Any) -> Any:
            return await self._call(op, path, **kw)

        return S3Writer(
            call, bucket, key,
            part_size=part_size,
            max_in_flight=max(1, min(x.concurrency, _WRITE_MEMORY // part_size)),
            checksum=self.checksum == "when_supported",
            retry=self.config.retry,
        )

    async def close(self) -> None:
        with self._sync_lock:
            pool, self._pool = self._pool, None
            self._sync_client = None
            self._region_clients.clear()
            self._gets.clear()
        if pool is not None:
            pool.close()
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None and self._loop is asyncio.get_running_loop():
            try:
                await stack.aclose()
            except Exception as exc:
                log.debug("closing the S3 client failed: %s", type(exc).__name__)


def _certifi() -> str | None:
    try:
        from botocore.httpsession import get_cert_path
    except ImportError:  # pragma: no cover - very old botocore
        return None
    path = get_cert_path(True)
    return path if isinstance(path, str) else None


def parse_list_page(body: bytes, prefix: str) -> dict[str, Any]:
    """The fields of a ``ListObjectsV2`` answer that :meth:`S3Provider.list` uses,
    shaped as botocore returns them (keys URL-decoded, dates parsed)."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise ProtocolError("unreadable ListObjectsV2 answer", service="s3",
                            path=redact(prefix)) from exc

    def text(node: Any, name: str) -> str | None:
        for child in node:
            if child.tag.rpartition("}")[2] == name:
                return str(child.text or "")
        return None

    encoded = text(root, "EncodingType") == "url"
    contents = []
    for node in root:
        if node.tag.rpartition("}")[2] != "Contents":
            continue
        key = text(node, "Key")
        if not key:  # (it was listed as the key "": the prefix itself)
            raise ProtocolError("the ListObjectsV2 answer lists an object without a key",
                                service="s3", path=redact(prefix))
        key = unquote_plus(key) if encoded else key
        modified = text(node, "LastModified")
        given = text(node, "Size") or "0"
        size = parse_decimal(given)
        if size is None:
            raise ProtocolError(f"the ListObjectsV2 answer gives key {key[:100]!r} the size "
                                f"{given[:40]!r}", service="s3", path=redact(prefix))
        try:
            mtime = datetime.fromisoformat(modified.replace("Z", "+00:00")) if modified else None
        except ValueError:
            raise ProtocolError(f"the ListObjectsV2 answer gives key {key[:100]!r} the date "
                                f"{(modified or '')[:40]!r}", service="s3",
                                path=redact(prefix)) from None
        contents.append({"Key": key, "Size": size, "ETag": text(node, "ETag"),
                         "LastModified": mtime})
    prefixes = []
    for node in root:
        if node.tag.rpartition("}")[2] == "CommonPrefixes" and (name := text(node, "Prefix")):
            prefixes.append({"Prefix": unquote_plus(name) if encoded else name})
    return {"Contents": contents, "CommonPrefixes": prefixes,
            "IsTruncated": (text(root, "IsTruncated") or "").lower() == "true",
            "NextContinuationToken": text(root, "NextContinuationToken")}


def _head_info(path: str, answer: Answer) -> ObjectInfo:
    """What a HEAD answer says about an object (as botocore's ``head_object``)."""
    h = answer.headers
    size = parse_decimal(h.get("Content-Length"))
    if size is None:
        raise ProtocolError("HEAD answer without a usable Content-Length", service="s3",
                            path=redact(path))
    return ObjectInfo(
        path=path,
        size=size,
        etag=h.get("ETag"),
        mtime=parse_http_date(h.get("Last-Modified")),
        version=h.get("x-amz-version-id"),
        extra={"content_type": h.get("Content-Type")},
    )
