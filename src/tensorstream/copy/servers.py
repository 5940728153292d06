"""Whether two names reach one server: ``http://127.0.0.1:9000``, ``http://localhost:9000``,
``HTTP://LOCALHOST.:9000/`` and ``http://[::ffff:127.0.0.1]:9000`` are one S3 endpoint.

Taken for two stores, ``sync --delete s3://b/p/sub/ s3://b/p/`` with the other side's
endpoint written another way deleted its own source. Names are first normalised (scheme
and host case, a host's trailing dot, brackets and the spelling of an IP address, the
scheme's default port, a trailing slash). Names that still differ are compared by address,
with one bounded, cached ``getaddrinfo`` per host name:

* two addresses: one server only when they are equal (``127.0.0.1`` and ``[::1]`` may
  well be two processes);
* a name and an address, or two names of a protocol that has no virtual hosts (plain
  Redis): one server when the name resolves to the other side's address(es);
* two names over HTTP(S)/TLS: one server only when every address they share is a loopback
  one (names of this machine). Elsewhere one address serves many sites and S3 accounts
  told apart by name (virtual hosts, SNI, a CDN): refusing a copy between two of them
  would be wrong.

A name that cannot be resolved in time is taken for another server: that never refuses
a copy that is otherwise fine, the only cost is the check it skips.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import threading
from urllib.parse import urlsplit

__all__ = ["RESOLVE_TIMEOUT", "Server", "endpoint_server", "same_server", "server"]

#: Seconds to wait for one host name's addresses (getaddrinfo has no timeout of its own).
RESOLVE_TIMEOUT = 2.0

_DEFAULT_PORTS = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}
#: Protocols whose server cannot tell apart the names it is reached by (no Host, no SNI).
_NO_VIRTUAL_HOSTS = frozenset({"redis"})

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_RESOLVED: dict[str, frozenset[_Address]] = {}
_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    """A thread of the parent may have held the lock at the fork (it does not exist here);
    the names it resolved still hold."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclasses.dataclass(frozen=True)
class Server:
    """A normalised server name: ``scheme://host:port/path``."""

    scheme: str
    host: str
    port: int | None
    path: str = ""


def server(scheme: str, host: str, port: int | None, path: str = "") -> Server:
    """``scheme``, ``host``, ``port`` (None: the scheme's default) and ``path`` normalised."""
    scheme = scheme.lower()
    host = host.strip("[]").lower().rstrip(".")
    address = _literal(host)
    return Server(scheme, host if address is None else str(address),
                  _DEFAULT_PORTS.get(scheme) if port is None else port, path.rstrip("/"))


def endpoint_server(url: str) -> Server | None:
    """The server of an endpoint URL (``http://host:port[/path]``); None if it names none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return server(parts.scheme, parts.hostname, port, parts.path)


def same_server(a: Server, b: Server) -> bool:
    """Whether ``a`` and ``b`` certainly reach one server (the module's rules)."""
    if a == b:
        return True
    if (a.scheme, a.port, a.path) != (b.scheme, b.port, b.path):
        return False
    literal_a, literal_b = _literal(a.host), _literal(b.host)
    if literal_a is not None and literal_b is not None:
        return False  # normalised, and still two addresses
    shared = _addresses(a.host) & _addresses(b.host)
    if literal_a is None and literal_b is None and a.scheme not in _NO_VIRTUAL_HOSTS:
        return bool(shared) and all(address.is_loopback for address in shared)
    return bool(shared)


def _literal(host: str) -> _Address | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 one as IPv4), or None for a name."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _addresses(host: str) -> frozenset[_Address]:
    """The addresses of ``host``, resolved once per process and at most
    :data:`RESOLVE_TIMEOUT` seconds (none when it fails or takes longer)."""
    literal = _literal(host)
    if literal is not None:
        return frozenset({literal})
    with _LOCK:
        cached = _RESOLVED.get(host)
    if cached is not None:
        return cached
    found: list[str] = []

    def look_up() -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        found.extend(str(info[4][0]) for info in infos)

    # A daemon thread: a resolver that hangs must neither hold the copy nor its exit.
    thread = threading.Thread(target=look_up, name="tensorstream-resolve", daemon=True)
    thread.start()
    thread.join(RESOLVE_TIMEOUT)
    names = [] if thread.is_alive() else found
    result = frozenset(a for a in map(_literal, names) if a is not None)
    with _LOCK:
        _RESOLVED[host] = result
    return result
