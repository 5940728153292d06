"""Uniform mocked backends (S3, HTTP, Redis) with fault injection, as the pytest
plugin hands them to tests (see ``docs/testing.md``).

Every backend has the same small API::

    backend.put("model.tensors", data)          # store bytes (bypasses faults)
    backend.get("model.tensors") == data        # read them back (bypasses faults)
    tensorstream.open(backend.uri("model.tensors"), **backend.options)
    backend.faults.latency(0.05).drop_after(1 << 20, times=1)
    backend.name, backend.kind                  # "redis", "redis-server" | "fakeredis"

:class:`BackendServers` owns the long-lived servers (started lazily, one of
each kind per session); each test gets a fresh :class:`Backend` view with its
own bucket / key prefix and faults that are reset when it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import quote

from .faults import FAULT_NAMES as FAULT_NAMES  # re-exported: defined here before faults.py
from .faults import (
    Faults,
    UnsupportedFault,
    _HTTPServerFaults,
    _RedisProxyFaults,
    _S3ProxyFaults,
)
from .http_proxy import HTTPFaultProxy
from .leftovers import RedisKeys, s3_buckets
from .session_redis import start_redis, start_secured_redis
from .start_once import ServerStartError, StartOnce
from .tcp_proxy import TCPFaultProxy

__all__ = [
    "Backend",
    "BackendServers",
    "Faults",
    "HTTPBackend",
    "RedisBackend",
    "S3Backend",
    "ServerStartError",
    "UnsupportedFault",
]

_counter = itertools.count(1)


def _unique(prefix: str) -> str:
    return f"{prefix}{next(_counter)}-{secrets.token_hex(3)}"


# ----------------------------------------------------------------- backends
class Backend:
    """One test's view of a mocked backend (see the module docstring)."""

    name: ClassVar[str] = ""
    #: Which server implements it ("moto", "aiohttp", "redis-server", "fakeredis").
    kind: str = ""
    #: CA bundle path to trust (TLS backends), else ``None``.
    ca_bundle: str | None = None
    faults: Faults

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.uri('')!r}>"

    def uri(self, key: str) -> str:
        """The URI of ``key`` on this backend (no secrets in it)."""
        raise NotImplementedError

    @property
    def options(self) -> dict[str, Any]:
        """Storage options to pass to tensorstream calls (a fresh copy)."""
        raise NotImplementedError

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that reach this backend without ``options``: the
        names serving code already reads (``AWS_*``/``S3_*``, ``REDIS_*``,
        ``TENSORSTREAM_HTTP_TOKEN``, ``SSL_CERT_FILE``). A fresh copy."""
        raise NotImplementedError

    def apply_env(self, monkeypatch: Any) -> dict[str, str]:
        """Set :attr:`env` with ``monkeypatch.setenv`` (undone after the test), so an
        unmodified loader that reads the environment reaches this backend. Returns it."""
        env = self.env
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return env

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key`` directly (faults do not apply)."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        """The bytes stored at ``key``, read directly (``KeyError`` if absent)."""
        raise NotImplementedError

    def close(self) -> None:
        """Reset faults and remove this test's objects."""
        self.faults.reset()


class S3Backend(Backend):
    """A fresh bucket on the session's moto server, reached through a fault proxy.

    ``auth``: whether the server checks SigV4 signatures (the default): a wrong
    key or secret is refused as real S3 refuses it.
    """

    name = "s3"
    kind = "moto"

    def __init__(self, server: Any, proxy: HTTPFaultProxy) -> None:
        self.server = server
        self.proxy = proxy
        self.auth = bool(server.auth)
        self.bucket = _unique("ts-test-")
        self._buckets = [self.bucket]
        self._before = s3_buckets(server.client)  # a bucket the test makes itself goes too
        server.create_bucket(self.bucket)
        self.faults = _S3ProxyFaults(self)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key.lstrip('/')}"

    @property
    def options(self) -> dict[str, Any]:
        return self.server.options(s3_endpoint=self.proxy.url)

    @property
    def env(self) -> dict[str, str]:
        opts = self.options
        env = {
            "AWS_ACCESS_KEY_ID": opts["s3_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": opts["s3_secret_access_key"],
            "AWS_REGION": opts["s3_region"],
            "AWS_DEFAULT_REGION": opts["s3_region"],
            "AWS_ENDPOINT_URL": opts["s3_endpoint"],
            "AWS_ENDPOINT_URL_S3": opts["s3_endpoint"],
            # vLLM's and tensorizer's names
            "S3_ACCESS_KEY_ID": opts["s3_access_key_id"],
            "S3_SECRET_ACCESS_KEY": opts["s3_secret_access_key"],
            "S3_ENDPOINT_URL": opts["s3_endpoint"],
        }
        if opts.get("ca_bundle"):
            env["AWS_CA_BUNDLE"] = opts["ca_bundle"]
        return env

    @property
    def client(self) -> Any:
        """A boto3 S3 client with the server's keys, straight to moto (no faults)."""
        return self.server.client

    def create_bucket(self, name: str | None = None) -> str:
        """Create another bucket (removed with its objects after the test); returns its name."""
        bucket = name or _unique("ts-test-")
        self.server.create_bucket(bucket)
        self._buckets.append(bucket)
        return bucket

    @property
    def requests(self) -> list[Any]:
        """Requests the fault proxy saw (``method``, ``path``, ``headers``, ``status``)."""
        return self.proxy.requests

    def put(self, key: str, data: bytes) -> None:
        self.server.put(self.bucket, key.lstrip("/"), bytes(data))

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.server.get(self.bucket, key.lstrip("/")))
        except self.server.client.exceptions.NoSuchKey as exc:
            raise KeyError(key) from exc

    def close(self) -> None:
        self.proxy.cancel_requests()  # before the reset: none goes on under the next test's faults
        super().close()
        self.proxy.clear_log()
        client = self.server.client
        buckets = list(self._buckets)
        with contextlib.suppress(Exception):  # best effort, as below
            buckets += sorted(s3_buckets(client) - self._before - set(buckets))
        for bucket in buckets:
            try:
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if keys:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
                # Then every version and delete marker: with versioning on, the deletes
                # above only add markers, and the bucket (not empty) used to outlive the
                # test, handing its objects to a later create_bucket of the same name.
                for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
                    versions = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                                for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                    if versions:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": versions})
                for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                    client.abort_multipart_upload(Bucket=bucket, Key=up["Key"],
                                                  UploadId=up["UploadId"])
                client.delete_bucket(Bucket=bucket)
            except Exception:  # best effort: generated bucket names are never reused
                pass


class HTTPBackend(Backend):
    """A key prefix on a session aiohttp server (Range, ETag, optional token and TLS)."""

    name = "http"
    kind = "aiohttp"

    def __init__(self, server: Any) -> None:
        self.server = server
        self.prefix = _unique("t")
        self.ca_bundle = server.ca_bundle_path
        self.token: str | None = server.token
        self._keys: set[str] = set()
        self.faults = _HTTPServerFaults(self)
        self.faults.reset()

    def key(self, key: str) -> str:
        return f"{self.prefix}/{key.lstrip('/')}"

    def uri(self, key: str) -> str:
        # Percent-encoded: a space, '%', '?' or '#' in a key is part of the key,
        # not of the URL's syntax (the server decodes the path back to the key).
        return str(self.server.url(quote(self.key(key), safe="/")))

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.server.options)

    @property
    def env(self) -> dict[str, str]:
        env = {}
        if self.token:
            env["TENSORSTREAM_HTTP_TOKEN"] = self.token
        if self.ca_bundle:
            env["SSL_CERT_FILE"] = self.ca_bundle
        return env

    @property
    def requests(self) -> list[Any]:
        """Requests the server answered (``method``, ``path``, ``headers``, ``status``)."""
        return list(self.server.requests)

    def put(self, key: str, data: bytes) -> None:
        self._keys.add(self.key(key))
        self.server.put(self.key(key), bytes(data))

    def get(self, key: str) -> bytes:
        return bytes(self.server.get(self.key(key)))

    def close(self) -> None:
        self.server.cancel_requests()  # before the reset, as on S3
        super().close()
        self.server.clear_log()
        for k in self._keys:
            self.server.delete(k)


class RedisBackend(Backend):
    """A key prefix on the session Redis (real or fakeredis), reached through a TCP proxy.

    Objects are stored in tensorstream's manifest layout (``docs/redis.md``).
    ``username``/``password`` (an ACL user, or the default user's
    ``requirepass``) and ``tls`` say how the server was configured
    (``@pytest.mark.tensorstream_redis(password=True, acl_user=True, tls=True)``);
    :attr:`options` and :attr:`env` carry them, :attr:`uri` never does.
    """

    name = "redis"

    def __init__(self, kind: str, host: str, port: int, proxy: TCPFaultProxy, *,
                 username: str | None = None, password: str | None = None,
                 ca_bundle: str | None = None, client_kwargs: dict[str, Any] | None = None) -> None:
        import redis

        self.kind = kind
        self.host, self.port = host, port
        self.proxy = proxy
        self.prefix = _unique("t")
        self.username, self.password = username, password
        self.tls = ca_bundle is not None
        self.ca_bundle = ca_bundle
        #: A synchronous ``redis.Redis`` straight to the server (no faults), with
        #: admin access.
        self.client: Any = redis.Redis(host=host, port=port, socket_timeout=30,
                                       **(client_kwargs or {}))

        def connect(db: int) -> Any:
            return redis.Redis(host=host, port=port, db=db, socket_timeout=30,
                               **(client_kwargs or {}))

        # Keys the test adds anywhere (env-mode code writes its own) are deleted after it.
        self._leftovers = RedisKeys(connect)
        self.faults = _RedisProxyFaults(self)
        self.faults.reset()
        self._lock = threading.Lock()

    def key(self, key: str) -> str:
        return f"{self.prefix}/{key.lstrip('/')}"

    def uri(self, key: str) -> str:
        scheme = "rediss" if self.tls else "redis"
        # Percent-encoded: tensorstream decodes a Redis URI's path to the key.
        return f"{scheme}://127.0.0.1:{self.proxy.port}/{quote(self.key(key), safe='/')}"

    @property
    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if self.username:
            opts["redis_username"] = self.username
        if self.password:
            opts["redis_password"] = self.password
        if self.ca_bundle:
            opts["ca_bundle"] = self.ca_bundle
        return opts

    @property
    def env(self) -> dict[str, str]:
        scheme = "rediss" if self.tls else "redis"
        env = {"REDIS_HOST": "127.0.0.1", "REDIS_PORT": str(self.proxy.port),
               "REDIS_URL": f"{scheme}://127.0.0.1:{self.proxy.port}/0"}
        if self.username:
            env["REDIS_USERNAME"] = self.username
        if self.password:
            env["REDIS_PASSWORD"] = self.password
        if self.ca_bundle:
            env["SSL_CERT_FILE"] = self.ca_bundle
        return env

    def put(self, key: str, data: bytes, *, chunk_size: int = 1 << 20) -> None:
        from ..providers.redis.layout import chunk_key, manifest_fields

        data = bytes(data)
        path = self.key(key)
        gen = secrets.token_hex(8)
        fields = manifest_fields(size=len(data), chunk_size=chunk_size, generation=gen,
                                 checksum=f"sha256:{hashlib.sha256(data).hexdigest()}",
                                 mtime=time.time())
        with self._lock:
            old = self.client.hget(path, "generation")
            old_size = self.client.hget(path, "size")
            old_cs = self.client.hget(path, "chunk_size")
            pipe = self.client.pipeline(transaction=True)
            for start in range(0, len(data), chunk_size):
                pipe.set(chunk_key(path, gen, start), data[start:start + chunk_size])
            pipe.delete(path)
            pipe.hset(path, mapping=fields)
            if old is not None and old_size is not None and old_cs is not None:
                # Like tensorstream's writer: the previous generation disappears.
                for start in range(0, int(old_size), int(old_cs)):
                    pipe.delete(chunk_key(path, old.decode(), start))
            pipe.execute()

    def get(self, key: str) -> bytes:
        from ..providers.redis.layout import chunk_key

        path = self.key(key)
        fields = self.client.hgetall(path)
        if not fields:
            raise KeyError(key)
        size, cs, gen = int(fields[b"size"]), int(fields[b"chunk_size"]), fields[b"generation"]
        parts = self.client.mget([chunk_key(path, gen.decode(), s) for s in range(0, size, cs)])
        return b"".join(p or b"" for p in parts)

    def close(self) -> None:
        self.proxy.cancel_requests()  # before the reset, as on S3
        super().close()
        try:
            self._leftovers.delete_new()  # the test's prefix, and what it wrote elsewhere
        finally:
            self.client.close()


# ------------------------------------------------------------------ servers
class BackendServers:
    """The session's servers, each started on first use and stopped by :meth:`close`.

    ``redis``: ``"auto"`` (redis-server if installed, else fakeredis), ``"real"``
    or ``"fake"``.
    """

    def __init__(self, *, redis: str = "auto") -> None:
        if redis not in ("auto", "real", "fake"):
            raise ValueError("redis must be 'auto', 'real' or 'fake'")
        self.redis_mode = redis
        #: An empty directory for isolated ``HOME``/AWS config files, and for the servers'
        #: temporary files (the plugin sets it to one in pytest's basetemp: a run killed
        #: without teardown left them in the system's temp dir for good, a password in
        #: redis.conf included; pytest prunes old basetemps).
        self.sandbox: str = ""
        self._lock = threading.Lock()
        self._s3: dict[bool, tuple[Any, HTTPFaultProxy]] = {}
        self._http: dict[tuple[bool, str | bool | None], Any] = {}
        self._redis: tuple[str, str, int, TCPFaultProxy] | None = None
        self._redis_secured: dict[tuple[Any, ...], tuple[Any, TCPFaultProxy]] = {}
        self._closers: list[Callable[[], None]] = []
        #: Starts each server (under the lock); a failure sticks for the session.
        self._start = StartOnce()

    @property
    def _tmp_dir(self) -> str | None:
        return self.sandbox or None

    def s3(self, *, auth: bool = True) -> S3Backend:
        """``auth=False``: a server that does not check signatures (any key works)."""
        def start() -> tuple[Any, HTTPFaultProxy]:
            from .s3_server import MotoS3Server

            server = MotoS3Server(auth=auth, tmp_dir=self._tmp_dir).start()
            self._closers.append(server.stop)
            proxy = HTTPFaultProxy(server.endpoint_url).start()
            self._closers.append(proxy.stop)
            return server, proxy

        with self._lock:
            if auth not in self._s3:
                name = "the moto S3 server" + ("" if auth else " without signature checks")
                self._s3[auth] = self._start(("s3", auth), name, start)
        return S3Backend(*self._s3[auth])

    def http(self, *, tls: bool = False, token: str | bool | None = None) -> HTTPBackend:
        """``token=True``: require a bearer token made up once per session."""
        key = (bool(tls), token or None)

        def start() -> Any:
            from .http_server import HTTPTestServer

            tok = "tstok-" + secrets.token_hex(8) if token is True else (token or None)
            server = HTTPTestServer(tls=tls, token=tok, tmp_dir=self._tmp_dir).start()
            self._closers.append(server.stop)
            return server

        with self._lock:
            server = self._http.get(key)
            if server is None:
                name = "the HTTP test server" + (" with TLS" if tls else "")
                server = self._http[key] = self._start(("http", *key), name, start)
        return HTTPBackend(server)

    def redis(self, *, password: str | bool | None = None, acl_user: Any = None,
              tls: bool = False) -> RedisBackend:
        """Plain Redis (``redis-server`` or fakeredis, see ``redis=``), or, with
        ``password`` (``True``: made up), ``acl_user`` (``True``, a user name or
        ``(name, password)``) or ``tls=True``, a ``redis-server`` configured so
        (one per configuration per session; needs ``redis-server``)."""
        if password is None and acl_user is None and not tls:
            with self._lock:
                if self._redis is None:
                    self._redis = self._start(("redis",), "the session's Redis", lambda:
                                              start_redis(self.redis_mode, self._tmp_dir,
                                                          self._closers))
            kind, host, port, proxy = self._redis
            return RedisBackend(kind, host, port, proxy)
        key = (password, acl_user if not isinstance(acl_user, list) else tuple(acl_user), bool(tls))
        with self._lock:
            if key not in self._redis_secured:
                self._redis_secured[key] = self._start(
                    ("redis", *key), "the redis-server with " + ", ".join(
                        n for n, v in (("a password", password), ("an ACL user", acl_user),
                                       ("TLS", tls)) if v),
                    lambda: start_secured_redis(password, acl_user, tls, self._tmp_dir,
                                                self._closers))
        server, proxy = self._redis_secured[key]
        user, user_pw = next(iter(server.acl_users.items()), (None, None))
        client_kwargs: dict[str, Any] = {"password": server.password}
        if server.tls:
            client_kwargs.update(ssl=True, ssl_ca_certs=server.ca_file)
        return RedisBackend(
            "redis-server", server.host, server.port, proxy, username=user,
            password=user_pw if user else server.password,
            ca_bundle=server.ca_file if server.tls else None, client_kwargs=client_kwargs,
        )

    def close(self) -> None:
        """Stop every server that was started (in reverse order); never raises."""
        with self._lock:
            closers, self._closers = self._closers, []
            self._redis = None
            self._s3.clear()
            self._http.clear()
            self._redis_secured.clear()
            self._start.forget()
        for close in reversed(closers):
            try:
                close()
            except Exception:
                pass
