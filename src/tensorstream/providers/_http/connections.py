"""Connections of the HTTP(S) data plane: trust settings, redirect rules, the
keep-alive pool, and the cancel handle that stops a blocking request from
another thread (see :mod:`.range_get`).

Through a proxy (:mod:`.proxies`), an https origin's connection is a
``CONNECT`` tunnel (``http.client``'s ``set_tunnel``; TLS to the origin inside
it, verified as without a proxy) and an http origin's sends its requests in
absolute form (:class:`ForwardingConnection`). Either is pooled under the
origin's key like a direct one, so reuse is unchanged; the choice is made once
per new connection, and nothing is done per request without a proxy."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import select
import socket
import ssl
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from ..._client_cert import ca_context, load_client_cert
from ...config import Timeouts
from ...errors import ConnectionFailedError, TensorstreamError
from .answer_head import HeadedResponse
from .proxies import NO_PROXIES, Proxy, ProxySettings, refusal_hint, tunnel_refusal

__all__ = ["Cancel", "Cancelled", "ConnectionPool", "ForwardingConnection", "ProxyRefused",
           "RedirectPolicy", "TLSSettings", "current"]

_MAX_REDIRECTS = 5
Key = tuple[str, str, int]
_Key = Key
#: The cancel handle of the async call this thread serves (set by :func:`.threads.in_thread`).
current = threading.local()


@dataclasses.dataclass(frozen=True)
class TLSSettings:
    """Trust settings of a pool (the same meaning as the async providers')."""

    ca_bundle: str | None = None
    insecure: bool = False
    client_cert: str | None = None
    client_key: str | None = None

    def context(self) -> ssl.SSLContext:
        """The client context. A CA bundle or client certificate that cannot be
        loaded is a :class:`ConfigurationError` naming the file: OpenSSL's own
        error named none, and was answered with the advice to pass a CA bundle."""
        ctx = ca_context(self.ca_bundle)
        if self.client_cert is not None:
            load_client_cert(ctx, self.client_cert, self.client_key)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


@dataclasses.dataclass(frozen=True)
class RedirectPolicy:
    """How the blocking path follows redirects (the async path's rules):
    credentials are dropped when the origin changes, link-local/metadata
    targets are refused unless ``allow_private``."""

    credentials: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    allow_private: bool = False
    max_redirects: int = _MAX_REDIRECTS


class ConnectionPool:
    """Thread-safe keep-alive connections, at most ``max_idle`` idle per origin."""

    def __init__(self, tls: TLSSettings | None = None, *, max_idle: int = 16,
                 proxies: ProxySettings = NO_PROXIES) -> None:
        self.tls = tls or TLSSettings()
        self.max_idle = max_idle
        self.proxies = proxies
        self._lock = threading.Lock()
        self._idle: dict[_Key, list[http.client.HTTPConnection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._pid = os.getpid()
        self.created = 0  # connections opened (tests and metrics)
        _pools.add(self)

    def _forget_after_fork(self) -> None:
        """In a forked child: the idle connections' sockets are the parent's (never
        used here), and the lock may have been held by a thread of the parent,
        which does not exist here: a new one."""
        self._lock = threading.Lock()
        self._idle = {}
        self._pid = os.getpid()

    def __repr__(self) -> str:
        proxies = f", proxies={self.proxies!r}" if self.proxies else ""
        return f"ConnectionPool({self.tls!r}, max_idle={self.max_idle}{proxies})"

    def describe(self, key: _Key) -> str:
        """``host:port`` of ``key``, and the proxy its connections go through (for
        errors: no credentials)."""
        proxy = self.proxies.for_origin(*key) if self.proxies else None
        through = f" through the proxy {proxy.label}" if proxy else ""
        return f"{key[1]}:{key[2]}{through}"

    def _context(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl is None:
                self._ssl = self.tls.context()
            return self._ssl

    def acquire(self, key: _Key, timeouts: Timeouts, *, fresh: bool = False
                ) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection to ``key`` (``reused=True``) or, when there is none
        or ``fresh`` is asked, a new, connected one."""
        while not fresh:
            with self._lock:
                if self._pid != os.getpid():  # sockets shared with the parent: never use
                    self._idle.clear()
                    self._pid = os.getpid()
                idle = self._idle.get(key)
                if not idle:
                    break
                pooled = idle.pop()
            if not _stale(pooled):
                return pooled, True
            pooled.close()
        scheme, host, port = key
        proxy = self.proxies.for_origin(scheme, host, port) if self.proxies else None
        conn: http.client.HTTPConnection
        if proxy is not None:
            conn = self._through(proxy, key, timeouts)
        elif scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeouts.connect,
                                               context=self._context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeouts.connect)
        # Its answers' heads are read under the operation's deadline, and capped
        # (a CONNECT's answer too: http.client reads it with response_class).
        conn.response_class = HeadedResponse
        try:
            conn.connect()  # TCP (+ CONNECT) (+ TLS handshake) under the connect timeout
        except OSError as exc:
            conn.close()
            if proxy is not None and not isinstance(exc, (TimeoutError, ssl.SSLError)):
                raise ProxyRefused.of(exc, proxy, host, port) from None
            raise
        except BaseException:
            conn.close()
            raise
        assert conn.sock is not None
        conn.sock.settimeout(timeouts.idle)  # from now on: the time between bytes
        with self._lock:
            self.created += 1
        return conn, False

    def _through(self, proxy: Proxy, key: _Key, timeouts: Timeouts) -> http.client.HTTPConnection:
        """A connection to ``key``'s origin through ``proxy`` (not connected yet)."""
        scheme, host, port = key
        proxy.check()
        if scheme == "https":
            conn = _TunnelConnection(proxy.host, proxy.port, timeout=timeouts.connect,
                                     context=self._context())
            conn.set_tunnel(host, port, headers=proxy.headers())
            return conn
        return ForwardingConnection(proxy, host, port, timeout=timeouts.connect)

    def release(self, key: _Key, conn: http.client.HTTPConnection) -> None:
        """Return a connection whose last response was read to its end."""
        with self._lock:
            if self._pid == os.getpid():
                idle = self._idle.setdefault(key, [])
                if len(idle) < self.max_idle:
                    idle.append(conn)
                    return
        conn.close()

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        """Close every idle connection (connections in use close when their read ends)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


#: Every pool of this process (weak), made the child's own after a fork.
_pools: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()


def _forget_inherited_pools() -> None:
    for pool in list(_pools):
        pool._forget_after_fork()


os.register_at_fork(after_in_child=_forget_inherited_pools)



class _TunnelConnection(http.client.HTTPSConnection):
    """An https connection through a ``CONNECT`` tunnel. Python before 3.12 writes
    an IPv6 address unbracketed in the CONNECT line (``CONNECT ::1:443``, which
    proxies refuse); it is bracketed there only, never in the TLS server name or
    the ``Host`` header (which bracket it themselves)."""

    def _tunnel(self) -> None:
        this: Any = self  # (http.client's private tunnel attributes have no stubs)
        host = this._tunnel_host
        if sys.version_info >= (3, 12) or ":" not in host or host.startswith("["):
            super()._tunnel()  # type: ignore[misc]
            return
        this._tunnel_host = f"[{host}]"
        try:
            super()._tunnel()  # type: ignore[misc]
        finally:
            this._tunnel_host = host


class ForwardingConnection(http.client.HTTPConnection):
    """A connection to an ``http://`` origin through a proxy: each request is
    sent to the proxy in absolute form (``GET http://origin/path``), with the
    origin's ``Host`` and the proxy's credentials (``Proxy-Authorization``)."""

    def __init__(self, proxy: Proxy, host: str, port: int, *, timeout: float | None) -> None:
        super().__init__(proxy.host, proxy.port, timeout=timeout)
        self.proxy = proxy
        # http.client derives Host from an absolute URL's authority, as it would
        # from a direct connection (the port only when not the default).
        authority = f"[{host}]" if ":" in host else host
        self._prefix = f"http://{authority}" + (f":{port}" if port != 80 else "")
        self._proxy_headers = proxy.headers()

    def putrequest(self, method: str, url: str, skip_host: bool = False,
                   skip_accept_encoding: bool = False) -> None:
        super().putrequest(method, self._prefix + url, skip_host=skip_host,
                           skip_accept_encoding=skip_accept_encoding)
        for name, value in self._proxy_headers.items():
            self.putheader(name, value)


class ProxyRefused(OSError):
    """A proxy refused a tunnel or a request, or could not be reached
    (:meth:`error` makes the tensorstream error of it, in context)."""

    def __init__(self, message: str, *, temporary: bool) -> None:
        super().__init__(message)
        self.message = message
        self.temporary = temporary

    @classmethod
    def of(cls, exc: OSError, proxy: Proxy, host: str, port: int) -> ProxyRefused:
        """From ``http.client``'s error connecting through ``proxy`` to ``host:port``."""
        refused = tunnel_refusal(exc)
        if refused is None:  # the proxy is not reachable, or broke the tunnel
            return cls(f"cannot connect to {host}:{port} through the proxy {proxy.label}: "
                       f"{type(exc).__name__}: {exc}", temporary=True)
        return cls.refusal(proxy, host, port, *refused, what="the tunnel (CONNECT)")

    @classmethod
    def refusal(cls, proxy: Proxy, host: str, port: int, status: int, reason: str, *,
                what: str) -> ProxyRefused:
        """The proxy answered ``status`` to a CONNECT or a forwarded request:
        not the origin's answer, so never retried as one."""
        return cls(f"the proxy {proxy.label} refused {what} to {host}:{port}: {status} "
                   f"{reason.strip()}{refusal_hint(status, proxy)}", temporary=False)

    def error(self, *, service: str, path: str) -> TensorstreamError:
        err = ConnectionFailedError(self.message, service=service, path=path)
        err.temporary = self.temporary
        return err


def _stale(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection has something to read: the server closed it
    (its keep-alive timeout), or bytes its last answer left (a CRLF after a body,
    a second answer). Either way the next answer read from it would not be the
    next request's (urllib3 checks the same before reusing a connection)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        poller = select.poll()  # (select.select refuses descriptors past 1023)
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class Cancelled(TensorstreamError):
    """A request refused because its caller was cancelled (never retried)."""

    temporary = False


class Cancel:
    """Stops blocking requests from another thread (an async caller cancelled).

    The connection in use is shut down (``shutdown`` wakes a thread blocked
    in ``recv_into``; ``close`` alone would not), so the reading thread fails
    at once with an error and stops writing into the caller's buffer; any
    later request of that thread fails with :class:`Cancelled`, so a retry
    layer gives up at once."""

    def __init__(self) -> None:
        self.cancelled = False
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def attach(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conn = conn
            cancelled = self.cancelled
        if cancelled:
            _shutdown(conn)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            conn = self._conn
        if conn is not None:
            _shutdown(conn)


def _shutdown(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


