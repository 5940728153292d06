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

Each kind's view is in a module of its own (:mod:`~tensorstream.testing.backend`:
the base, ``s3_backend``, ``http_backend``, ``redis_backend``); this module
re-exports them.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any

from .backend import Backend
from .faults import FAULT_NAMES as FAULT_NAMES  # re-exported: defined here before faults.py
from .faults import Faults, UnsupportedFault
from .http_backend import HTTPBackend
from .http_proxy import HTTPFaultProxy
from .redis_backend import RedisBackend
from .s3_backend import S3Backend
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
