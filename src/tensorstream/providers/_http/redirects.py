"""Following a redirect: its target (never echoed: a Location is often a presigned
URL), whether it keeps the origin credentials may go to, and the refusal of a
link-local or cloud metadata address."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import urllib.parse

from yarl import URL

from ...errors import PermissionDeniedError, ProtocolError
from .status_errors import redact_path

__all__ = [
    "REDIRECT_STATUSES",
    "is_metadata_address",
    "origin",
    "redirect_step",
    "refuse_metadata_target",
    "wire_target",
]

#: The statuses whose Location is followed.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


_METADATA_V6 = ipaddress.ip_address("fd00:ec2::254")


def is_metadata_address(address: str) -> bool:
    """True for link-local / cloud metadata addresses (169.254.0.0/16, fe80::/10,
    fd00:ec2::254, and IPv4-mapped forms of them)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip == _METADATA_V6


def origin(url: URL) -> tuple[str, str, int | None]:
    """``(scheme, host, port)``: credentials never cross a change of it."""
    return (url.scheme, (url.host or "").lower(), url.explicit_port or url.port)


#: What http.client refuses in a URL (CVE-2019-9740): spaces and control characters.
_URL_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")
#: What a request target cannot carry as it is: http.client refuses a space or a
#: control character and cannot encode a character beyond ASCII.
_UNSENDABLE = re.compile(r"[^\x21-\x7e]")
_SENDABLE = "".join(chr(c) for c in range(0x21, 0x7F))


def wire_target(target: str) -> str:
    """``target`` (``/path?query``) as a request line carries it: spaces, control
    characters and characters beyond ASCII percent-encoded (UTF-8), as requests,
    aiohttp and browsers send them; everything else byte for byte, so a presigned
    URL's ``%2F`` stays ``%2F`` and its signature still matches.

    >>> wire_target("/models/modèle v2.bin?X-Amz-Signature=a%2Fb")
    '/models/mod%C3%A8le%20v2.bin?X-Amz-Signature=a%2Fb'
    """
    if _UNSENDABLE.search(target) is None:
        return target
    return urllib.parse.quote(target, safe=_SENDABLE, errors="surrogateescape")


def redirect_step(url: URL, location: str, *, path: str) -> tuple[URL, bool]:
    """The redirect target of ``Location`` relative to ``url``, and whether it
    keeps the origin (if not, credential headers must be dropped)."""
    if not location.isascii() and _URL_FORBIDDEN.search(location) is None:
        # A file name beyond ASCII (servers send UTF-8 raw): encoded as requests and
        # browsers do (spaces and control characters stay refused, below); its host
        # (an IDN name) is left to http.client and the resolver.
        with contextlib.suppress(UnicodeError):  # http.client read the UTF-8 as Latin-1
            location = location.encode("latin-1").decode("utf-8")
        parts = urllib.parse.urlsplit(location)
        location = urllib.parse.urlunsplit(parts._replace(
            path=wire_target(parts.path), query=wire_target(parts.query),
            fragment=""))
    try:
        target = url.join(URL(location, encoded=True))
        target.host, target.port  # noqa: B018  (yarl parses these lazily: port 99999 raises)
        if _URL_FORBIDDEN.search(str(target)):
            # http.client refuses it (InvalidURL) quoting the whole URL, and a Location
            # can echo what was sent (an Authorization header, "Bearer <token>")
            raise ValueError("a space or control character in the Location")
    except (ValueError, TypeError):
        # never echo it: a Location is often a presigned URL
        raise ProtocolError("the server redirected to a malformed Location",
                            service="http", path=redact_path(path)) from None
    if target.scheme not in ("http", "https"):
        raise ProtocolError(f"redirect to unsupported scheme {target.scheme!r}",
                            service="http", path=redact_path(path))
    return target, origin(target) == origin(url)


def refuse_metadata_target(addresses: list[str], *, path: str) -> None:
    """Refuse a redirect whose host or resolved addresses are link-local/metadata."""
    if any(is_metadata_address(a) for a in addresses):
        raise PermissionDeniedError(
            "refusing to follow a redirect to a link-local/metadata address "
            "(pass allow_private_redirects=True to allow it)",
            service="http", path=redact_path(path))
