"""Which HTTP proxy, if any, a request to an origin goes through.

One resolution for every request tensorstream makes to an HTTP(S) or S3
endpoint: the data plane's own connections (:mod:`.connections`) and, for S3,
botocore's and aiobotocore's (listings, writes), which are handed the decision
for their endpoint as ``Config(proxies=...)`` so both agree.

* ``proxy=None`` (the default): the environment, as ``requests`` and
  ``urllib.request.getproxies`` read it: ``https_proxy``/``http_proxy`` for the
  target's scheme, else ``all_proxy``, the lower-case name before the
  upper-case one (``HTTP_PROXY`` is ignored in a CGI request, as urllib does);
  ``NO_PROXY`` exempts hosts: ``*``, a host, a domain and its sub-domains
  (``example.com`` and ``.example.com`` alike), ``host:port``, an IP address or
  a CIDR network (``10.0.0.0/8``, as requests matches them).
* ``proxy="http://[user:password@]host:port"``: that proxy for every request
  of the provider, whatever the environment says (``NO_PROXY`` included).
* ``proxy=False``: no proxy, whatever the environment says.

Only ``http://`` proxies are supported (https targets go through a ``CONNECT``
tunnel, TLS to the origin inside it); an ``https://`` one is refused with the
``http://`` URL to write instead (:func:`_https_refusal` says why). Credentials
in the proxy URL are sent as ``Proxy-Authorization: Basic``; they never appear
in a ``repr`` or a message: a proxy is shown as ``host:port`` and the variable
(or option) it came from.

>>> settings = resolve_proxies(None, env={"HTTPS_PROXY": "http://u:pw@proxy:3128",
...                                      "NO_PROXY": "internal.example,10.0.0.0/8"})
>>> settings.for_origin("https", "models.example.com", 443)
Proxy(proxy:3128 from HTTPS_PROXY)
>>> settings.for_origin("https", "10.1.2.3", 443) is None
True
>>> settings.for_origin("http", "models.example.com", 80) is None  # no HTTP_PROXY
True
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..._log_redaction import register_secret
from ...errors import ConfigurationError

__all__ = ["NO_PROXIES", "Proxy", "ProxySettings", "host_listed", "refusal_hint",
           "resolve_proxies", "tunnel_refusal"]


@dataclasses.dataclass(frozen=True)
class Proxy:
    """An ``http://`` proxy: where it is and what it is sent (never shown)."""

    host: str
    port: int
    #: Where it was configured (``HTTPS_PROXY``, ``argument proxy``).
    source: str
    #: ``Proxy-Authorization`` value (``Basic ...``), or ``None``.
    authorization: str | None = dataclasses.field(default=None, repr=False)
    #: The URL as given (with its credentials), for botocore (never shown).
    full_url: str = dataclasses.field(default="", repr=False)
    #: Why a proxy from the environment cannot be used (a ``socks5://`` one): said
    #: when a request would go through it, so a variable set for other tools does
    #: not break requests that ``NO_PROXY`` exempts.
    problem: str | None = None

    def __repr__(self) -> str:
        return f"Proxy({self.where} from {self.source})"

    @property
    def label(self) -> str:
        """``host:port (from SOURCE)``, for messages."""
        return f"{self.where} (from {self.source})" if self.problem is None else self.source

    @property
    def where(self) -> str:
        """``host:port`` (brackets around an IPv6 address), for messages."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def check(self) -> None:
        """Raise the :class:`ConfigurationError` of an unusable proxy."""
        if self.problem is not None:
            raise ConfigurationError(
                f"{self.problem}; or set NO_PROXY for this host, or pass proxy=False (no "
                "proxy) or proxy='http://host:port' (on the command line: --no-proxy, "
                "--proxy URL)")

    def headers(self) -> dict[str, str]:
        """Headers every request through it carries (a CONNECT's, or a forwarded request's)."""
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}

    def url(self) -> str:
        """The proxy's URL with its credentials, for botocore's ``proxies`` (never logged)."""
        return self.full_url or f"http://{self.where}"

    def __reduce__(self) -> Any:
        raise TypeError("a Proxy may hold a password and cannot be pickled")


@dataclasses.dataclass(frozen=True)
class ProxySettings:
    """The proxies of one provider: per target scheme, and the ``NO_PROXY`` list."""

    by_scheme: Mapping[str, Proxy] = dataclasses.field(default_factory=dict)
    no_proxy: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.by_scheme)

    def for_origin(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy a request to ``scheme://host:port`` goes through, else ``None``."""
        proxy = self.by_scheme.get(scheme)
        if proxy is None or host_listed(host, port, self.no_proxy):
            return None
        return proxy

    def for_url(self, url: str) -> Proxy | None:
        """:meth:`for_origin` of a URL (``https://host[:port]/...``)."""
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            return None
        return self.for_origin(scheme, parts.hostname, parts.port or _DEFAULT_PORT[scheme])

    def botocore_proxies(self, endpoint_url: str) -> dict[str, str]:
        """botocore's ``Config(proxies=...)`` for a client of ``endpoint_url``: this
        resolution's answer for it, so botocore never reads the environment itself
        (its ``NO_PROXY`` matching differs: no CIDR). ``{}`` means no proxy."""
        proxy = self.for_url(endpoint_url)
        if proxy is None:
            return {}
        proxy.check()
        return {"http": proxy.url(), "https": proxy.url()}


NO_PROXIES = ProxySettings()
_HINTS = {
    407: "it wants credentials: give them in the proxy URL (http://user:password@host:port)",
    403: "the proxy does not allow this destination",
    502: "the proxy could not reach the destination",
    503: "the proxy could not reach the destination",
    504: "the proxy timed out reaching the destination",
}


#: http.client's message for a CONNECT answered with another status than 200
#: (urllib3, and so botocore, quote it in their own errors).
_TUNNEL_FAILED = re.compile(r"Tunnel connection failed: (\d{3})\b ?([^'\")]*)")


def tunnel_refusal(exc: BaseException | None) -> tuple[int, str] | None:
    """``(status, reason)`` of the refused CONNECT that ``exc`` or an exception
    chained to it reports (http.client's message, aiohttp's ``status``), else ``None``."""
    for _ in range(8):
        if exc is None:
            return None
        found = _TUNNEL_FAILED.search(str(exc))
        if found is not None:
            return int(found.group(1)), found.group(2).strip()
        status = getattr(exc, "status", None)
        if type(exc).__name__ == "ClientHttpProxyError" and isinstance(status, int):
            return status, str(getattr(exc, "message", "") or "")
        exc = exc.__cause__ or exc.__context__
    return None


def refusal_hint(status: int, proxy: Proxy | None) -> str:
    """``"; why"`` for a proxy's refusal ``status`` (``""`` when there is nothing to add)."""
    if status == 407 and proxy is not None and proxy.authorization:
        return "; it refused the user and password in the proxy URL (not shown)"
    hint = _HINTS.get(status)
    return f"; {hint}" if hint else ""
_DEFAULT_PORT = {"http": 80, "https": 443}


def resolve_proxies(option: Any = None, env: Mapping[str, str] | None = None) -> ProxySettings:
    """The proxies for a provider given its ``proxy`` option (see the module doc)."""
    if option is False:
        return NO_PROXIES
    if option is not None:
        if not isinstance(option, str) or not option.strip():
            raise ConfigurationError(
                "proxy must be an http:// proxy URL, or False for no proxy (None: the "
                "environment's HTTPS_PROXY/HTTP_PROXY/ALL_PROXY/NO_PROXY)")
        proxy = _parse(option, "argument proxy")
        return ProxySettings({"http": proxy, "https": proxy})
    found = _environment(os.environ if env is None else env)
    by_scheme = {}
    for scheme in ("http", "https"):
        name = found.get(scheme) or found.get("all")
        if name is not None:
            try:
                by_scheme[scheme] = _parse(name[1], name[0])
            except ConfigurationError as exc:
                by_scheme[scheme] = Proxy("", 0, name[0], problem=exc.message)
    if not by_scheme:
        return NO_PROXIES
    no = found.get("no")
    entries = tuple(e.strip().lower() for e in no[1].split(",") if e.strip()) if no else ()
    return ProxySettings(by_scheme, entries)


def _environment(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{scheme: (variable, value)}`` exactly as ``urllib.request.getproxies_environment``
    reads them: any ``*_proxy`` variable, then the lower-case names again, so they win."""
    found: dict[str, tuple[str, str]] = {}
    for name, value in env.items():
        if value and name[-6:].lower() == "_proxy":
            found[name[:-6].lower()] = (name, value)
    if "REQUEST_METHOD" in env:  # a CGI script: HTTP_PROXY may be a client's Proxy header
        found.pop("http", None)
    for name, value in env.items():
        if name[-6:] == "_proxy":
            if value:
                found[name[:-6].lower()] = (name, value)
            else:
                found.pop(name[:-6].lower(), None)  # an empty lower-case name unsets
    return found


def _parse(url: str, source: str) -> Proxy:
    """A :class:`Proxy` from ``url`` (``host:port`` alone means ``http://``)."""
    text = url.strip()
    if "://" not in text:
        text = f"http://{text}"  # as requests and curl take a bare host:port
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
        host = parts.hostname
    except ValueError:
        host = None
    scheme = text.partition("://")[0].lower()
    if host is None:
        raise ConfigurationError(f"the proxy from {source} is not a URL (its value is not shown)")
    if scheme == "https":
        raise ConfigurationError(_https_refusal(source, host, port, parts.username is not None))
    if scheme != "http":
        raise ConfigurationError(
            f"{source} is a {scheme}:// proxy: tensorstream supports http:// "
            "proxies only (https targets go through its CONNECT tunnel, TLS inside)")
    authorization = None
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        pair = f"{user}:{password}"
        try:
            raw = pair.encode("latin-1")  # as requests encodes basic credentials
        except UnicodeEncodeError:
            raw = pair.encode()
        token = base64.b64encode(raw).decode("ascii")
        authorization = f"Basic {token}"
        # Masked wherever a library echoes them (aiohttp's proxy errors show the URL).
        for secret in (authorization, password, user):
            register_secret(secret)
    return Proxy(host.lower(), port or 80, source, authorization, text)


def _https_refusal(source: str, host: str, port: int | None, credentials: bool) -> str:
    """Why an ``https://`` proxy is refused, and the URL to write instead (no credentials).

    TLS to the proxy means TLS inside TLS to an https origin, which the data
    plane's ``http.client`` connections cannot do (``set_tunnel`` speaks CONNECT
    over plain TCP) without hand-written TLS-in-TLS; botocore and aiohttp could,
    but the reads must take the listings' and writes' route."""
    where = f"[{host}]" if ":" in host else host
    where += f":{port}" if port else ":PORT"
    return (f"{source} is an https:// proxy (TLS to the proxy), which tensorstream cannot use: "
            "most proxies take plain HTTP on that port (https targets stay encrypted end to end "
            f"inside its CONNECT tunnel), so write it as http://{where}"
            f"{' with the same user and password' if credentials else ''}; for a proxy that "
            "takes TLS only, run a local TLS forwarder to it (e.g. stunnel) and give "
            "http://127.0.0.1:PORT of that")


def host_listed(host: str, port: int, entries: tuple[str, ...]) -> bool:
    """Whether ``entries`` (``NO_PROXY``'s syntax) name ``host:port``: ``*``; a name equal
    to the host or a parent domain of it (a leading dot or not; ``host:port`` only
    at that port); an IP address, or a network holding the host's address."""
    if not entries:
        return False
    host = host.lower().strip("[]")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in entries:
        if entry == "*":
            return True
        name, want_port = _split_port(entry)
        if want_port is not None and want_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.lstrip(".")
        if name and (host == name or host.endswith(f".{name}")):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    """``("host", 8080)`` from ``host:8080`` (``[v6]:port`` too); no port: ``None``."""
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        return name, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        if port.isdigit():
            return name, int(port)
    return entry, None
