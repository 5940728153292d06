"""The S3 provider's clients: what a request needs before it is sent.

:class:`S3Clients` (the base of :class:`~tensorstream.providers.s3.provider.S3Provider`)
builds and holds them: the aiobotocore client of writes, deletes and ``ListBuckets``
(built on first use, one per event loop); the plain botocore client that only
resolves URLs and signs reads (none at all where static keys, a path-style
endpoint and a known region suffice: :class:`~.signing.PathStyle`); the clients
signing for buckets S3 said are in another region; and the reads' connection
pool (the reads' in :mod:`.blocking_clients`). It also maps what goes wrong on
the way (building a session, refreshing credentials, botocore errors) to
tensorstream errors, with the context of the credentials and endpoint in use
(:class:`~.errors.ErrorContext`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from ..._gcpause import paused
from ..._log_redaction import install_secret_filter, register_secret
from ...config import CommonConfig
from .._http.proxies import ProxySettings
from .._http.range_get import ConnectionPool
from .blocking_clients import BlockingClients
from .chain import chain_source
from .config import S3Credentials, no_credentials_error
from .errors import (
    ErrorContext,
    from_credential_chain,
    map_s3_error,
    map_session_error,
)
from .process import bound_credential_process
from .profile import aws_files
from .session import shared_data_loader
from .signing import PathStyle, SignedGets

__all__ = ["S3Clients"]

log = logging.getLogger("tensorstream.s3")
install_secret_filter()  # botocore DEBUG logs carry session tokens

#: How long ``close`` waits for the client of a loop running in another thread to close.
_CLOSE_ELSEWHERE_S = 5.0

#: Where botocore sends requests without an endpoint (its proxy decision is made for it).
_AWS_ENDPOINT = "https://s3.amazonaws.com"


class S3Clients(BlockingClients):
    """The clients, credentials in use and connection pool of one S3 provider.

    Built lazily and thread-safely; :meth:`close` drops them all. The arguments
    are :class:`~tensorstream.providers.s3.provider.S3Provider`'s, checked there.
    """

    def __init__(
        self,
        credentials: S3Credentials,
        config: CommonConfig,
        *,
        checksum: str,
        ca_bundle: str | None,
        insecure: bool,
        proxies: ProxySettings,
        process_timeout: float,
        client_cert: str | None,
        client_key: str | None,
    ) -> None:
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
        self.proxies = proxies
        self._endpoint_proxy = self.proxies.for_url(
            credentials.endpoint.value if credentials.endpoint else _AWS_ENDPOINT)
        #: The aiobotocore client of each event loop (and what closes it): a client
        #: belongs to the loop it was made on, and the sync API's I/O loop and a
        #: program's own may both use one provider.
        self._clients: dict[asyncio.AbstractEventLoop,
                            tuple[Any, contextlib.AsyncExitStack]] = {}
        self._client_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._clients_pid = os.getpid()  # (a forked child's copies are the parent's clients)
        self._key_source = credentials.key_source
        # The blocking path: a sync botocore client (signing only) and a pool.
        self._sync_lock = threading.Lock()
        self._sync_client: Any = None
        self._pool: ConnectionPool | None = None
        self._gets = SignedGets()  # object URLs and reusable signatures (blocking path)
        _all_clients.add(self)
        self._sync_creds: Any = None
        #: botocore's chain's credentials of the aiobotocore client (writes, deletes,
        #: bucket listings), whose keys are masked like the blocking path's
        self._chain_creds: Any = None
        self._default_ca: str | None = None
        self._default_ca_source: str | None = None  # where botocore's configuration set it
        self._light: PathStyle | bool | None = None  # None: not decided yet
        #: Buckets S3 said are in another region than the configured one, and the
        #: clients signing for those regions.
        self._bucket_regions: dict[str, str] = {}
        self._region_clients: dict[str, Any] = {}

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
        # botocore's chain: the keys it found, for either client (only the blocking
        # path's were masked: a delete's error quoted an echoed session token)
        for chain in (self._sync_creds, self._chain_creds):
            found += _held_keys(chain)
        return tuple(dict.fromkeys(found))

    def _note_sent(self, **_: Any) -> None:
        """botocore's ``before-send``: the keys a request was just signed with
        (a refresh may have changed them) are masked in every log record from
        here on, botocore's DEBUG dump of an error body that echoes them too.
        Returns ``None``: an answer here would stand in for the server's."""
        for secret in self._secrets():
            register_secret(secret)

    async def _get_client(self) -> Any:
        """The aiobotocore client of the running loop (made on first use). One made on
        another loop was replaced, dropped unclosed, on each turn between two loops."""
        loop = asyncio.get_running_loop()
        made = self._clients.get(loop)
        if made is not None and self._clients_pid == os.getpid():
            return made[0]
        if self._clients_pid != os.getpid():  # a forked child: the parent's, left alone
            self._clients, self._client_locks, self._clients_pid = {}, {}, os.getpid()
        for gone in [lp for lp in self._clients if lp.is_closed()]:
            # (the client of a finished asyncio.run)
            self._client_locks.pop(gone, None)
            await self._close_client(self._clients.pop(gone)[1], gone, self._clients_pid)
        async with self._client_locks.setdefault(loop, asyncio.Lock()):
            made = self._clients.get(loop)
            if made is None:
                made = self._clients[loop] = await self._create_client()
        return made[0]

    def _session_error(self, exc: Exception, profile: str | None) -> BaseException:
        """Map an error from building a botocore session/client (async or sync alike)."""
        creds = self.credentials
        return map_session_error(exc, profile, aws_files(os.environ),
                                 creds.profile.source if creds.profile else "")

    async def _create_client(self) -> tuple[Any, contextlib.AsyncExitStack]:
        creds = self.credentials
        profile = creds.profile.value if creds.profile else None
        try:
            # In a worker thread: the first client of a process imported aiobotocore
            # and aiohttp (and built its TLS context) and parsed botocore's S3 model,
            # ~1 s that blocked the shared event loop, and every read on it.
            session = await asyncio.to_thread(_new_session, profile)
            if creds.uses_botocore_chain:
                bound_credential_process(session, self.process_timeout)
                found = await session.get_credentials()
                if found is None:
                    raise no_credentials_error(creds)
                self._key_source = chain_source(getattr(found, "method", None), profile)
                self._chain_creds = found
            session.register("before-send.s3", self._note_sent)
        except Exception as exc:
            mapped = self._session_error(exc, profile)
            if mapped is exc:
                raise
            raise mapped from exc
        from aiobotocore.config import AioConfig  # (imported by _new_session)

        cfg_kwargs, kwargs = self._client_options()
        kwargs["config"] = AioConfig(**cfg_kwargs)
        stack = contextlib.AsyncExitStack()
        with paused():  # (botocore's S3 model: _gcpause)
            client = await stack.enter_async_context(session.create_client("s3", **kwargs))
        return client, stack

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
            # Without user info, as boto3 sends it: S3 requests are signed with the key pair,
            # and aiohttp refuses user info beside that Authorization header (every write
            # and delete failed as "cannot reach").
            kwargs["endpoint_url"] = _without_user_info(creds.endpoint.value)
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

    async def close(self) -> None:
        """Drop the clients and close the pool (the provider can be used again)."""
        with self._sync_lock:
            pool, self._pool = self._pool, None
            self._sync_client = None
            self._region_clients.clear()
            self._gets.clear()
        if pool is not None:
            pool.close()
        clients, self._clients, self._client_locks = self._clients, {}, {}
        for loop, (_, stack) in clients.items():
            await self._close_client(stack, loop, self._clients_pid)

    @staticmethod
    async def _close_client(stack: contextlib.AsyncExitStack, loop: asyncio.AbstractEventLoop,
                            pid: int) -> None:
        """Close an aiobotocore client made on ``loop``: there when that loop runs in
        another thread (the sync API's I/O loop, say), else here (aiohttp then only
        marks a closed loop's connections closed). It was dropped unclosed when
        closed from another loop: "Unclosed client session", connections left open."""
        if pid != os.getpid():
            return  # a forked child: its connections are the parent's
        try:
            if loop is asyncio.get_running_loop() or not loop.is_running():
                await stack.aclose()
            else:
                done = asyncio.run_coroutine_threadsafe(stack.aclose(), loop)
                await asyncio.wait_for(asyncio.wrap_future(done), _CLOSE_ELSEWHERE_S)
        except Exception as exc:
            log.debug("closing the S3 client failed: %s", type(exc).__name__)


def _new_session(profile: str | None) -> Any:
    """An aiobotocore session for ``profile`` with the process's data loader, its
    S3 model loaded (off the event loop: see :meth:`S3Clients._create_client`).
    Nothing here belongs to a loop: the credentials are looked up on it."""
    import aiobotocore.config  # noqa: F401  (imports aiohttp: its TLS context too)
    from aiobotocore.session import AioSession

    session = AioSession(profile=profile)
    session.register_component("data_loader", shared_data_loader(session))
    warm = getattr(session, "warm_up_loader_caches", None)  # (not in older aiobotocore)
    if warm is not None:
        with paused():  # (botocore's S3 model: _gcpause)
            warm("s3")
    return session


def _held_keys(creds: Any) -> list[str]:
    """The secret key and session token botocore credentials hold now, read
    without refreshing them (a refresh runs a process or a request, and
    aiobotocore's refreshable credentials only refresh when awaited)."""
    if creds is None:
        return []
    if hasattr(creds, "_frozen_credentials"):  # refreshable: the keys last fetched
        creds = creds._frozen_credentials
        if creds is None:  # none fetched yet (deferred)
            return []
    return [s for s in (getattr(creds, "secret_key", None), getattr(creds, "token", None))
            if isinstance(s, str) and s]


#: Every provider's clients in this process (weak): a forked child gives each new
#: locks (a thread of the parent, which does not exist there, may have held them).
_all_clients: weakref.WeakSet[S3Clients] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for clients in list(_all_clients):
        clients._sync_lock = threading.Lock()
        clients._gets = SignedGets()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _without_user_info(url: str) -> str:
    """``url`` without its ``user:password@``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
