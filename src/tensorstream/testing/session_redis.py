"""The Redis servers behind the mocked Redis backends
(:class:`~tensorstream.testing.backends.BackendServers`): ``redis-server`` (plain,
or with a password, an ACL user or TLS) or fakeredis, each behind a TCP fault
proxy. Each start appends the stop of what it started to ``closers``."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any

from .tcp_proxy import TCPFaultProxy

__all__ = ["start_redis", "start_secured_redis"]

Closers = list[Callable[[], None]]


def start_secured_redis(password: str | bool | None, acl_user: Any, tls: bool,
                        tmp_dir: str | None, closers: Closers) -> tuple[Any, TCPFaultProxy]:
    """A ``redis-server`` with ``password`` (``True``: made up), ``acl_user``
    (``True``, a user name or ``(name, password)``) or TLS, and its proxy."""
    from .redis_server import RedisServer

    if password is True:
        password = "tspw-" + secrets.token_hex(8)
    users: dict[str, str] = {}
    if acl_user:
        if acl_user is True:
            acl_user = "tensorstream-test"
        name, pw = (acl_user, "tsacl-" + secrets.token_hex(8)) if isinstance(acl_user, str) \
            else tuple(acl_user)
        users[str(name)] = str(pw)
    server = RedisServer(password=password or None, acl_users=users, tls=tls,
                         tmp_dir=tmp_dir).start()
    closers.append(server.stop)
    proxy = TCPFaultProxy(server.host, server.port).start()
    closers.append(proxy.stop)
    return server, proxy


def start_redis(mode: str, tmp_dir: str | None,
                closers: Closers) -> tuple[str, str, int, TCPFaultProxy]:
    """A plain Redis (``mode``: ``"real"``, ``"fake"`` or ``"auto"``: redis-server if
    installed, else fakeredis) and its proxy: ``(kind, host, port, proxy)``."""
    from .redis_server import RedisServer, redis_available

    if mode == "real" or (mode == "auto" and redis_available()):
        server = RedisServer(tmp_dir=tmp_dir).start()
        closers.append(server.stop)
        kind, host, port = "redis-server", server.host, server.port
    else:
        kind, host, port = "fakeredis", *_start_fakeredis(closers)
    proxy = TCPFaultProxy(host, port).start()
    closers.append(proxy.stop)
    return kind, host, port, proxy


def _start_fakeredis(closers: Closers) -> tuple[str, int]:
    try:
        from fakeredis import TcpFakeServer
    except ImportError as exc:  # older fakeredis
        raise RuntimeError("fakeredis >= 2.26 (TcpFakeServer) is needed when redis-server "
                           "is not installed or --tensorstream-redis=fake is given: "
                           "pip install 'tensorstream[test]', or apt-get install "
                           "redis-server") from exc
    server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="tensorstream-fakeredis",
                              daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(10)

    closers.append(stop)
    host, port = server.server_address[:2]
    return str(host if isinstance(host, str) else host.decode()), int(port)
