"""Connections of the HTTP(S) data plane: trust settings, redirect rules, the
keep-alive pool, and the cancel handle that stops a blocking request from
another thread (see :mod:`.range_get`)."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import select
import socket
import ssl
import threading
from collections.abc import Mapping

from ...config import Timeouts
from ...errors import ConfigurationError, TensorstreamError
from .answer_head import HeadedResponse

__all__ = ["Cancel", "Cancelled", "ConnectionPool", "RedirectPolicy", "TLSSettings", "current"]

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
        ca = self.ca_bundle
        try:
            if ca is not None and os.path.isdir(ca):
                # a directory of hashed certificates (``openssl rehash``), as
                # requests' verify=<dir> and SSL_CERT_DIR take; cafile= refuses it
                ctx = ssl.create_default_context(capath=ca)
            else:
                ctx = ssl.create_default_context(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigurationError(
                f"cannot load the CA bundle {ca} ({_reason(exc)}): it must be a PEM file "
                "of CA certificates, or a directory of them hashed by 'openssl rehash'"
            ) from None
        if self.client_cert is not None:
            try:
                # A password callback, or OpenSSL prompts on the terminal for the
                # pass phrase of an encrypted key (a service would hang there).
                ctx.load_cert_chain(self.client_cert, self.client_key, password=_no_password)
            except (ssl.SSLError, OSError, ValueError) as exc:
                key = f" and key {self.client_key}" if self.client_key else ""
                raise ConfigurationError(
                    f"cannot load the client certificate {self.client_cert}{key} "
                    f"({_reason(exc)}): both must be PEM files, the key not encrypted; "
                    "pass client_key= when the key is not in the certificate file"
                ) from None
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def _no_password() -> str:
    raise ValueError("the client key is encrypted (tensorstream takes no pass phrase)")


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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

    def __init__(self, tls: TLSSettings | None = None, *, max_idle: int = 16) -> None:
        self.tls = tls or TLSSettings()
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[_Key, list[http.client.HTTPConnection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._pid = os.getpid()
        self.created = 0  # connections opened (tests and metrics)

    def __repr__(self) -> str:
        return f"ConnectionPool({self.tls!r}, max_idle={self.max_idle})"

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
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeouts.connect,
                                               context=self._context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeouts.connect)
        # Its answers' heads are read under the operation's deadline, and capped.
        conn.response_class = HeadedResponse
        try:
            conn.connect()  # TCP (+ TLS handshake) under the connect timeout
        except BaseException:
            conn.close()
            raise
        assert conn.sock is not None
        conn.sock.settimeout(timeouts.idle)  # from now on: the time between bytes
        with self._lock:
            self.created += 1
        return conn, False

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


