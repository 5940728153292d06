"""HTTP(S) credentials: bearer token, extra headers, basic auth and TLS material.

Precedence (first match wins; the resolved object records the source)::

    Authorization   headers={"Authorization": ...}  >  token=...  >
                    URI userinfo (basic auth)  >  env TENSORSTREAM_HTTP_TOKEN (to the
                    hosts env TENSORSTREAM_HTTP_TOKEN_HOSTS names, else to https://
                    servers and loopback ones)  >  the host's entry in ~/.netrc (or
                    $NETRC; basic auth, as curl --netrc, requests and aiohttp read it)
    CA bundle       ca_bundle=...  >  env SSL_CERT_FILE  >  env REQUESTS_CA_BUNDLE
                    >  env CURL_CA_BUNDLE  >  the system trust store
    client cert     client_cert=... (+ client_key=...)
    insecure        insecure=True only (never from the environment)

Values are :class:`~tensorstream.credentials.base.Sourced`; secrets are
masked in every ``repr`` and refuse to be pickled.

>>> creds = resolve_http_credentials(token="s3cr3t", env={})
>>> creds
HTTPCredentials(authorization=Sourced(***, from argument token), headers=[], ca_bundle=None, \
client_cert=None, insecure=False)
>>> creds.auth_headers()["Authorization"] == "Bearer s3cr3t"
True
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import logging
import netrc
import os
import stat
from collections.abc import Mapping
from typing import Any

from ...credentials.base import Sourced
from ...credentials.report import CredentialReport, report_line, tls_notes
from ...errors import ConfigurationError
from ...uri import ParsedURI
from .._http.proxies import host_listed

__all__ = [
    "OPTIONS",
    "LOOKED_IN",
    "describe_credentials",
    "HTTPCredentials",
    "TOKEN_ENV",
    "TOKEN_HOSTS_ENV",
    "netrc_path",
    "resolve_http_credentials",
]

#: Every option the HTTP(S) service accepts (credentials, headers, TLS, redirects).
OPTIONS = frozenset({
    "headers", "token", "ca_bundle", "insecure", "client_cert", "client_key", "allow_private_redirects",
    "proxy",
})

#: Environment variable holding a bearer token for HTTP(S) sources.
TOKEN_ENV = "TENSORSTREAM_HTTP_TOKEN"
#: The hosts :data:`TOKEN_ENV` is sent to (``NO_PROXY``'s syntax: names, ``.domain``,
#: ``host:port``, addresses, networks); unset: any https:// server and loopback ones.
TOKEN_HOSTS_ENV = "TENSORSTREAM_HTTP_TOKEN_HOSTS"

log = logging.getLogger("tensorstream.http")
#: Variables naming a CA bundle, first set wins: OpenSSL's, then the ones requests
#: reads (in its order), which users of requests and curl already have set.
CA_BUNDLE_ENVS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@dataclasses.dataclass(frozen=True)
class HTTPCredentials:
    """What an HTTP provider sends and trusts. Build with :func:`resolve_http_credentials`.

    ``authorization`` is the full ``Authorization`` header value (secret);
    ``headers`` are the other user-supplied headers (values treated as secret,
    since they often carry API keys). Both are credential headers: they are
    dropped when a redirect leaves the origin.
    """

    authorization: Sourced[str] | None = None
    headers: tuple[tuple[str, Sourced[str]], ...] = ()
    ca_bundle: Sourced[str] | None = None
    client_cert: Sourced[str] | None = None
    client_key: Sourced[str] | None = None
    insecure: bool = False
    #: Why env ``TENSORSTREAM_HTTP_TOKEN`` (set) is not sent to this server, else None.
    withheld: str | None = None

    def auth_headers(self) -> dict[str, str]:
        """The credential headers to send to the origin (never across origins)."""
        out = {name: value.value for name, value in self.headers}
        if self.authorization is not None:
            out["Authorization"] = self.authorization.value
        return out

    def __repr__(self) -> str:
        names = [name for name, _ in self.headers]
        return (
            f"HTTPCredentials(authorization={self.authorization!r}, headers={names!r}, "
            f"ca_bundle={self.ca_bundle!r}, client_cert={self.client_cert!r}, "
            f"insecure={self.insecure})"
        )

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("refusing to pickle HTTP credentials")


def _path_option(value: Any, name: str) -> str:
    path = os.fspath(value)
    if not isinstance(path, str) or not path:
        raise ConfigurationError(f"{name} must be a file path")
    return os.path.expanduser(path)


#: Where an Authorization header can come from, in order (for "looked in" messages).
LOOKED_IN = ("option headers", "option token", "URI userinfo", f"env {TOKEN_ENV}",
             "~/.netrc (or $NETRC)")


def netrc_path(env: Mapping[str, str]) -> str:
    """The netrc file read for basic auth: ``$NETRC``, else ``~/.netrc``."""
    if env.get("NETRC"):
        return env["NETRC"]
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".netrc")


def _netrc_authorization(host: str | None, env: Mapping[str, str]) -> Sourced[str] | None:
    """Basic auth for ``host`` from its netrc entry, whatever the case of either name (as
    curl compares them: host names know no case), else the file's ``default``; the source
    names the entry used."""
    if not host:
        return None
    path = netrc_path(env)
    if not os.path.isfile(path):  # absent, or a FIFO/device that would block a read
        return None
    try:
        hosts = netrc.netrc(path).hosts
        # (Python's netrc keeps ``default`` among the hosts, under that name)
        machine = next((m for m in hosts if m.lower() == host.lower() and m != "default"),
                       None)
        entry = hosts.get(machine or "default")
        where = f"[machine {machine}]" if machine is not None else "[default]"
    except netrc.NetrcParseError as exc:
        # Its message quotes the token it choked on, which may be a password.
        raise ConfigurationError(
            f"cannot parse {path} (netrc, read for HTTP basic auth to {host}) at line "
            f"{exc.lineno}; fix it, or set NETRC to another file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"cannot read {path} (netrc, read for HTTP basic auth to {host}): "
            f"{type(exc).__name__}") from None
    if entry is None:
        return None
    login, _account, password = entry
    if not login and not password:
        return None
    raw = f"{login or ''}:{password or ''}".encode()
    return Sourced("Basic " + base64.b64encode(raw).decode("ascii"), f"{path} {where}",
                   secret=True)


def _check_header_value(value: Sourced[str]) -> None:
    """A value http.client can send: it refused one with a line break quoting it
    (``Invalid header value b'Bearer <token>\\n'``) and one beyond Latin-1 with a
    ``UnicodeEncodeError`` holding it whole. The value is never shown."""
    problem = None
    if any(c in value.value for c in "\r\n\x00"):
        problem = "a line break or a NUL character"
    else:
        try:
            value.value.encode("latin-1")
        except UnicodeEncodeError:
            problem = "a character beyond Latin-1 (HTTP header values are Latin-1)"
    if problem is not None:
        raise ConfigurationError(f"the header value from {value.source} holds {problem}; "
                                 "the value is not shown")


def resolve_http_credentials(
    uri: Any = None,
    *,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    ca_bundle: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    insecure: bool = False,
    env: Mapping[str, str] | None = None,
) -> HTTPCredentials:
    """Resolve HTTP credentials from arguments, the URI's userinfo, the environment and netrc.

    ``uri`` is a :class:`~tensorstream.uri.ParsedURI` (its ``username`` /
    ``password`` give basic auth); ``env`` defaults to ``os.environ``.
    """
    env = os.environ if env is None else env
    extra: list[tuple[str, Sourced[str]]] = []
    authorization: Sourced[str] | None = None
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise ConfigurationError("headers must be a mapping of header name to value")
        for name, value in headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigurationError("header names and values must be strings")
            if name.lower() == "authorization":
                authorization = Sourced(value, "argument headers", secret=True)
            else:
                extra.append((name, Sourced(value, f"argument headers[{name!r}]", secret=True)))

    if authorization is None and token:
        authorization = Sourced(f"Bearer {token}", "argument token", secret=True)
    username = getattr(uri, "username", None)
    password = getattr(uri, "password", None)
    if authorization is None and (username or password):
        raw = f"{username or ''}:{password or ''}".encode()
        authorization = Sourced(
            "Basic " + base64.b64encode(raw).decode("ascii"), "URI userinfo", secret=True
        )
    withheld = None
    if authorization is None and env.get(TOKEN_ENV):
        withheld = _token_withheld(uri, env)
        if withheld is None:
            authorization = Sourced(f"Bearer {env[TOKEN_ENV]}", f"env {TOKEN_ENV}", secret=True)
    if authorization is None:
        authorization = _netrc_authorization(getattr(uri, "host", None), env)
    for sent in (authorization, *(v for _, v in extra)):
        if sent is not None:
            _check_header_value(sent)

    ca: Sourced[str] | None = None
    if ca_bundle is not None:
        ca = Sourced(_path_option(ca_bundle, "ca_bundle"), "argument ca_bundle")
    else:
        for name in CA_BUNDLE_ENVS:
            if env.get(name):
                ca = Sourced(env[name], f"env {name}")
                break
    if ca is not None:
        try:
            st = os.stat(ca.value)
        except OSError:
            raise ConfigurationError(
                f"CA bundle from {ca.source} does not exist: {ca.value}") from None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            # a FIFO or a device would block (or never end) when the TLS library reads it
            raise ConfigurationError(
                f"CA bundle from {ca.source} is not a regular file: {ca.value}")

    cert = key = None
    if client_cert is not None:
        cert = Sourced(_path_option(client_cert, "client_cert"), "argument client_cert")
    if client_key is not None:
        if cert is None:
            raise ConfigurationError("client_key needs client_cert")
        key = Sourced(_path_option(client_key, "client_key"), "argument client_key")
    if not isinstance(insecure, bool):
        raise ConfigurationError("insecure must be True or False")
    return HTTPCredentials(
        authorization=authorization,
        headers=tuple(extra),
        ca_bundle=ca,
        client_cert=cert,
        client_key=key,
        insecure=insecure,
        withheld=withheld,
    )


#: The plain http:// servers already told they were not sent the token (once each).
_WARNED: set[tuple[str, int]] = set()


def _loopback(host: str) -> bool:
    if host.lower().rstrip(".") in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _token_withheld(uri: Any, env: Mapping[str, str]) -> str | None:
    """Why env :data:`TOKEN_ENV` is not sent to ``uri``'s server, or None to send it.

    An ambient token went to every server a process read from, plain http:// ones
    included, where anyone on the path reads it. It goes to the hosts
    :data:`TOKEN_HOSTS_ENV` names where that is set, else to https:// servers and to
    loopback ones (a plain http:// server elsewhere is warned about once). An explicit
    ``token=`` or ``headers=`` is sent as given."""
    host = getattr(uri, "host", None)
    if not host:
        return None  # (no server to judge: resolved without a URI)
    scheme = str(getattr(uri, "scheme", "") or "").lower()
    port = getattr(uri, "port", None) or (443 if scheme == "https" else 80)
    listed = env.get(TOKEN_HOSTS_ENV, "")
    entries = tuple(e.strip() for e in listed.split(",") if e.strip())
    if entries:
        if host_listed(host, port, entries):
            return None
        return f"env {TOKEN_ENV} is set but {host} is not among env {TOKEN_HOSTS_ENV}'s hosts"
    if scheme == "https" or _loopback(host):
        return None
    why = (f"env {TOKEN_ENV} is not sent to {scheme}://{host}:{port}: plain http:// shows it "
           f"to anyone on the path; use https://, name the host in env {TOKEN_HOSTS_ENV} to "
           "send it there anyway, or pass token= (or --token)")
    if (host, port) not in _WARNED:
        _WARNED.add((host, port))
        log.warning("%s", why)
    return why


def describe_credentials(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Report for ``http(s)://`` (headers/token options > URI userinfo > environment)."""
    creds = resolve_http_credentials(
        parsed,
        token=options.get("token"),
        headers=options.get("headers"),
        ca_bundle=options.get("ca_bundle"),
        client_cert=options.get("client_cert"),
        client_key=options.get("client_key"),
        insecure=bool(options.get("insecure")),
    )
    lines = [report_line("authorization", creds.authorization)]
    lines += [report_line(f"header {name}", value) for name, value in creds.headers]
    lines += [
        report_line("ca_bundle", creds.ca_bundle),
        report_line("client_cert", creds.client_cert),
        report_line("client_key", creds.client_key),
    ]
    notes = tls_notes(options) + ((creds.withheld,) if creds.withheld else ())
    return CredentialReport(parsed.redacted(), tuple(lines), notes=notes)
