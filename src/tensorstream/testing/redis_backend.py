"""The mocked Redis backend: a key prefix on the session's Redis (real or
fakeredis), reached through a TCP fault proxy, objects stored in tensorstream's
manifest layout (see :mod:`tensorstream.testing.backends`)."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from typing import Any
from urllib.parse import quote

from .backend import Backend, unique_name
from .faults import _RedisProxyFaults
from .leftovers import RedisKeys
from .tcp_proxy import TCPFaultProxy

__all__ = ["RedisBackend"]


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
        self.prefix = unique_name("t")
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
