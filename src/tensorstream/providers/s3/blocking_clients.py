"""The blocking path's clients of an S3 provider: what its reads are signed with and
sent through.

Reads are signed by a plain botocore client that sends nothing (or by none at all
where static keys, a path-style endpoint and a known region suffice:
:class:`~.signing.PathStyle`), by one per region for buckets S3 said are in another
region, and go through the reads' connection pool, whose trust store is botocore's
where none was given. :class:`BlockingClients` is the base of
:class:`~.clients.S3Clients`, which sets the attributes declared here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..._gcpause import paused
from ...config import CommonConfig
from ...errors import ConfigurationError
from .._http.proxies import ProxySettings
from .._http.range_get import ConnectionPool, TLSSettings
from .chain import chain_source
from .config import S3Credentials, no_credentials_error
from .errors import WrongRegionError
from .process import bound_credential_process
from .profile import config_file, config_profile_name
from .session import shared_data_loader
from .signing import PathStyle, StaticCredentials, path_style, requests_endpoint

__all__ = ["BlockingClients"]

_T = TypeVar("_T")

log = logging.getLogger("tensorstream.s3")


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


class BlockingClients:
    """The signing clients and the connection pool of one S3 provider's reads, built
    lazily under ``_sync_lock``."""

    credentials: S3Credentials
    config: CommonConfig
    ca_bundle: str | None
    insecure: bool
    client_cert: str | None
    client_key: str | None
    process_timeout: float
    proxies: ProxySettings
    _key_source: str
    _sync_lock: threading.Lock
    _sync_client: Any
    _pool: ConnectionPool | None
    _sync_creds: Any
    _default_ca: str | None
    _default_ca_source: str | None
    _light: PathStyle | bool | None
    _bucket_regions: dict[str, str]
    _region_clients: dict[str, Any]

    if TYPE_CHECKING:  # (S3Clients's, shared with its async client)
        def _note_sent(self, **_: Any) -> None: ...

        def _client_options(self) -> tuple[dict[str, Any], dict[str, Any]]: ...

        def _session_error(self, exc: Exception, profile: str | None) -> BaseException: ...

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
            session.register("before-send.s3", self._note_sent)
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
            requests_endpoint(client)  # (its read URLs: where its requests go)
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


def _certifi() -> str | None:
    try:
        from botocore.httpsession import get_cert_path
    except ImportError:  # pragma: no cover - very old botocore
        return None
    path = get_cert_path(True)
    return path if isinstance(path, str) else None
