"""Small pure helpers of the HTTP data plane (:mod:`.range_get`), shared
by the HTTP and S3 providers: header parsing, the ranged-answer check,
address checks, and the one status/exception -> tensorstream error mapping.

Kept free of I/O so they can be fuzzed and unit-tested on their own.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import ipaddress
import re
import ssl
import time
import urllib.parse
from datetime import datetime, timezone
from typing import Any, NamedTuple

from yarl import URL

from ..._client_cert import client_cert_advice, client_cert_answer
from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    IncompleteReadError,
    InvalidRangeError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    ProtocolError,
    ServiceUnavailableError,
    StorageTimeoutError,
    TensorstreamError,
)
from ...uri import redact, redact_text
from ..base import Pin

__all__ = [
    "CREDENTIALS_DROPPED",
    "DROPPED_NOTE",
    "REDIRECT_STATUSES",
    "LIST_HEADERS",
    "ContentRange",
    "LowerHeaders",
    "body_refusal",
    "check_ranged_response",
    "conditional_headers",
    "exception_error",
    "note_etag",
    "needs_confirmation",
    "note_served",
    "served_version",
    "redact_path",
    "redirect_step",
    "wire_target",
    "refuse_metadata_target",
    "status_error",
    "etags_match",
    "origin",
    "is_metadata_address",
    "parse_content_range",
    "parse_decimal",
    "parse_http_date",
    "parse_retry_after",
]

# ASCII digits only: ``\d`` and ``str.isdigit`` also take digits that ``int`` refuses
# (``"\xb2"``, superscript two, is Latin-1: a header can carry it).
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:([0-9]+)-([0-9]+)|\*)/([0-9]+|\*)\s*$",
                            re.IGNORECASE)
_DECIMAL = re.compile(r"[0-9]{1,19}")


def parse_decimal(value: str | None) -> int | None:
    """A byte count or offset a server sent (``Content-Length``, a
    ``Content-Range`` number): ASCII digits, at most 19 of them (2**63 has 19),
    else ``None``. ``int()`` of thousands of digits raises ``ValueError``
    (Python's digit limit) and would reach the caller bare.

    >>> parse_decimal(" 42 "), parse_decimal("9" * 5000), parse_decimal("\\xb2")
    (42, None, None)
    """
    if value is None:
        return None
    value = value.strip()
    return int(value) if _DECIMAL.fullmatch(value) else None


class ContentRange(NamedTuple):
    """A parsed ``Content-Range``; ``None`` where the header says ``*``."""

    first: int | None
    last: int | None
    total: int | None


def parse_content_range(value: str | None) -> ContentRange | None:
    """Parse ``bytes first-last/total`` (or ``bytes */total``); ``None`` if malformed.

    >>> parse_content_range("bytes 0-99/1000")
    ContentRange(first=0, last=99, total=1000)
    >>> parse_content_range("bytes */0")
    ContentRange(first=None, last=None, total=0)
    >>> parse_content_range("bytes 5-2/10") is None
    True
    """
    if not value:
        return None
    m = _CONTENT_RANGE.match(value)
    if m is None:
        return None
    given = [None if g == "*" else g for g in m.groups()]
    numbers = [parse_decimal(g) for g in given]
    if any(g is not None and n is None for g, n in zip(given, numbers, strict=True)):
        return None  # a number too long to be a byte count
    first, last, total = numbers
    if first is not None and last is not None:
        if last < first or (total is not None and last >= total):
            return None
    elif total is None:
        return None  # "bytes */*" says nothing
    return ContentRange(first, last, total)


def parse_http_date(value: str | None) -> datetime | None:
    """An HTTP date (``Last-Modified``) as an aware UTC datetime, or ``None``."""
    if not value:
        return None
    try:
        dt = email.utils.parsedate_to_datetime(value)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        # In UTC, or a date at the edge of datetime's range (year 9999 at -2359)
        # would overflow later, when a pinned read sends it back.
        return dt.astimezone(timezone.utc)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:  # delta-seconds (fractions tolerated)
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if 0 <= seconds < float("inf") else None
    when = parse_http_date(value)
    if when is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def _opaque(etag: str) -> str:
    etag = etag.strip()
    return etag[2:] if etag.startswith("W/") else etag


def etags_match(a: str, b: str) -> bool:
    """Weak comparison of two ETags (``W/"x"`` equals ``"x"``)."""
    return _opaque(a) == _opaque(b)


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


# -- error mapping ----------------------------------------------------------------
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


#: Case-insensitive headers with ``.get(name)`` (the data plane's header view,
#: or http.client's HTTPMessage).
_Headers = Any


class LowerHeaders(dict[str, str]):
    """Headers from a mapping (botocore's lower-cased ``HTTPHeaders``), looked
    up case-insensitively like aiohttp's and http.client's."""

    def __init__(self, headers: Any) -> None:
        super().__init__((str(k).lower(), str(v)) for k, v in dict(headers).items())

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


def redact_path(path: str) -> str:
    """``/path?query`` with secret query parameters (presigned URLs) redacted."""
    return redact("http://h" + path)[len("http://h") :]


#: Set (True) on an answer's headers when credentials were dropped on the way to it.
CREDENTIALS_DROPPED = "credentials_dropped"
#: What a refusal after such a redirect says (the provider then names no source as sent).
DROPPED_NOTE = ("after a redirect to another origin (scheme, host or port), where "
                "credentials are never sent")


#: nginx's 400 page for a plain HTTP request to its TLS port.
_NGINX_PLAIN_TO_TLS = "The plain HTTP request was sent to HTTPS port"


def bad_request_advice(body: bytes) -> str | None:
    """What a 400 page of nginx's own says to do (a client certificate it requires,
    plain HTTP to its TLS port), or ``None``. Only its fixed phrases are matched: no
    other text of a body reaches a message."""
    advice = client_cert_answer(body)
    if advice is None and _NGINX_PLAIN_TO_TLS.lower() in body[:4096].decode("latin-1").lower():
        advice = (f"the port speaks TLS (nginx: '{_NGINX_PLAIN_TO_TLS}'): use https:// "
                  "instead of http://")
    return advice


def status_error(status: int, reason: str, headers: _Headers, *, path: str,
                 service: str = "http", body: bytes = b"") -> TensorstreamError:
    """The tensorstream error for an HTTP status that is not the expected answer
    (``body``: the start of the answer's body, for the advice of nginx's 400 pages)."""
    where = {"service": service, "path": redact_path(path)}
    msg = f"HTTP {status} {reason or ''}".rstrip()
    if status == 400 and (advice := bad_request_advice(body)) is not None:
        return ConfigurationError(f"{msg}: {advice}", **where)
    if status in (404, 410):
        return NotFoundError(f"{msg}: no such object", **where)
    if status in (401, 403):
        if getattr(headers, CREDENTIALS_DROPPED, False):
            msg += (f": access refused {DROPPED_NOTE}; pass the URL the server redirects to, "
                    "with the credentials for it")
            return PermissionDeniedError(msg, **where)
        return PermissionDeniedError(f"{msg}: access refused", **where)
    if status == 412:
        return ObjectChangedError(f"{msg}: the object changed (the pinned read's precondition "
                                  "failed)", **where)
    if status == 416:
        total = parse_content_range(headers.get("Content-Range"))
        size = f" of a {total.total}-byte object" if total and total.total is not None else ""
        return InvalidRangeError(f"{msg}: range past the end{size}", **where)
    if status in (408, 429) or (500 <= status < 600 and status not in (501, 505)):
        return ServiceUnavailableError(
            msg, retry_after=parse_retry_after(headers.get("Retry-After")), **where
        )
    if 400 <= status < 500:
        return ConfigurationError(f"{msg}: the server rejected the request", **where)
    return ProtocolError(f"unexpected {msg}", **where)


def exception_error(exc: BaseException, *, path: str, received: int = 0,
                    service: str = "http") -> TensorstreamError:
    """The tensorstream error for a transport exception (http.client, ssl, OS).

    ``received`` body bytes already landed make a broken connection a
    resumable :class:`IncompleteReadError`.
    """
    if isinstance(exc, TensorstreamError):
        return exc
    where = {"service": service, "path": redact_path(path)}
    # Cut: http.client quotes a bad status line whole (up to 64 KiB of a body).
    what = f"{type(exc).__name__}: {_cut(redact_text(str(exc)))}"
    if isinstance(exc, ssl.SSLError) and plain_text_answer(exc):
        err: TensorstreamError = ConnectionFailedError(
            f"the server answered in plain text, not TLS ({what}): use http:// instead of "
            "https://", **where)
        err.temporary = False
        return err
    if isinstance(exc, ssl.SSLError):
        advice = client_cert_advice(exc)
        err = ConnectionFailedError(
            f"TLS failed ({what}); " + (advice or "for a private CA pass ca_bundle=<PEM path> "
                                        "(insecure=True skips verification)"), **where)
        err.temporary = False  # an untrusted certificate does not fix itself
        return err
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError and socket.timeout alias it
        return StorageTimeoutError(f"timed out after {received} bytes", received=received,
                                   timeout="idle", **where)
    if received and isinstance(exc, (http.client.IncompleteRead, OSError)):
        return IncompleteReadError(f"body broken after {received} bytes ({what})",
                                   received=received, **where)
    if isinstance(exc, http.client.IncompleteRead):
        return IncompleteReadError(f"body broken ({what})", received=0, **where)
    if isinstance(exc, OSError):
        # includes http.client.RemoteDisconnected (a ConnectionResetError)
        return ConnectionFailedError(f"connection failed ({what})", **where)
    return ProtocolError(f"HTTP client error ({what})", **where)


def note_served(exc: TensorstreamError, served: Pin | None) -> TensorstreamError:
    """Remember on a broken body which version its first bytes came from
    (``exc.served``), so a resumed request is pinned to it and never mixes
    versions."""
    received: Any = getattr(exc, "received", None)
    if served is not None and received and exc.served is None:
        exc.served = served
    return exc


def note_etag(exc: TensorstreamError, etag: str | None) -> TensorstreamError:
    """:func:`note_served` with an ETag only (kept for callers outside tensorstream)."""
    return note_served(exc, Pin(etag=etag) if etag else None)


def conditional_headers(pin: Pin | None) -> dict[str, str]:
    """The validators sent with a read pinned to ``pin``, so the server itself
    refuses another version (412): ``If-Match`` with a strong ETag, else
    ``If-Unmodified-Since`` with the Last-Modified date."""
    if pin is None:
        return {}
    if pin.etag and not pin.etag.startswith("W/"):  # If-Match needs a strong ETag
        return {"If-Match": pin.etag}
    if pin.mtime is not None:
        return {"If-Unmodified-Since": email.utils.format_datetime(
            pin.mtime.astimezone(timezone.utc), usegmt=True)}
    return {}


#: Headers whose repeats form one comma-separated list of codings.
LIST_HEADERS = frozenset({"content-encoding", "transfer-encoding"})
#: Headers that say what the body is: two different values cannot both be believed.
_SINGLE_HEADERS = ("content-length", "content-range", "etag", "last-modified")


def _codings(value: str | None) -> list[str]:
    return [c.strip().lower() for c in (value or "").split(",") if c.strip()]


def body_refusal(headers: _Headers, *, stored_coding: bool = False) -> str | None:
    """Why an answer's body cannot be taken as the object's bytes as they
    arrive (``None``: it can): a content coding or a transfer coding other
    than ``chunked`` (neither is decoded here: ``http.client`` frames only a
    body whose transfer coding is exactly ``chunked``), or a header that
    describes the body given twice with different values.

    ``stored_coding``: the service stores ``Content-Encoding`` as the object's
    metadata and sends the bytes as stored (S3: an object uploaded with
    ``Content-Encoding: gzip`` is its gzip bytes, what ``aws s3 cp`` copies), so
    it is no reason to refuse; the body's framing is still checked."""
    content = [c for c in _codings(headers.get("Content-Encoding")) if c != "identity"]
    if content and not stored_coding:
        return f"Content-Encoding {', '.join(content)}"
    transfer = (headers.get("Transfer-Encoding") or "").strip()
    if transfer.lower() not in ("", "chunked"):  # exactly what http.client un-chunks
        return f"Transfer-Encoding {transfer}"
    repeated = [n for n in _SINGLE_HEADERS if n in getattr(headers, "conflicting", ())]
    if repeated:
        return f"{', '.join(repeated)} given twice with different values"
    return None


def _cut(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _shown(value: str | None, limit: int = 80) -> str:
    """A header value quoted in a message, cut to ``limit`` characters (a
    hostile server sends kilobytes of digits)."""
    if value is None or len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def served_version(headers: _Headers, total: int | None) -> Pin:
    """The version an answer reports: its ETag, Last-Modified and total size."""
    return Pin(size=total, etag=headers.get("ETag"),
               mtime=parse_http_date(headers.get("Last-Modified")))


def check_ranged_response(status: int, headers: _Headers, *, first: int, last: int,
                          pin: Pin | None, path: str, on_status: Any,
                          service: str = "http") -> Pin:
    """Raise unless the answer is exactly bytes ``first..last`` (inclusive) as a 206
    with no content coding and, with ``pin``, of that version: its
    ``Content-Range`` total equals the pinned size, and its ETag (or, without
    one, its Last-Modified) equals the pinned one. The one range check of every
    HTTP-based data path (HTTP and S3, async and blocking).

    ``on_status()`` builds the error for a status other than 200/206. Returns
    the version the answer reports (to remember on a broken body). An answer
    that reports neither an ETag nor a Last-Modified comparable to the pin is
    checked by size only; the caller confirms its version after the body
    (:func:`needs_confirmation`).
    """
    def refuse(why: str) -> ProtocolError:
        return ProtocolError(why, service=service, path=redact_path(path))

    if status == 200:
        raise refuse("the server ignored the Range header (200 instead of 206): it cannot "
                     "serve parts of an object, which tensorstream reads in parallel. Serve the "
                     "file with a server that can (nginx, Apache, Caddy, S3 and CDNs do; "
                     "'python -m http.server' does not), or fetch it whole with curl/wget")
    if status == 416 and pin is not None and pin.size is not None and first < pin.size:
        # The bytes asked lie inside the object the read is pinned to: it shrank.
        now = parse_content_range(headers.get("Content-Range"))
        size = f"now {now.total} bytes" if now is not None and now.total is not None \
            else "shorter now"
        raise ObjectChangedError(
            f"the object changed while it was being read (HTTP 416 for bytes {first}-{last} "
            f"of a {pin.size}-byte object: {size})", service=service, path=redact_path(path))
    if status != 206:
        raise on_status()
    why = body_refusal(headers, stored_coding=service == "s3")
    if why is not None:
        raise refuse(f"refusing a ranged body: {why}")
    cr = parse_content_range(headers.get("Content-Range"))
    if (cr is not None and cr.first == first and cr.total is not None
            and cr.last == cr.total - 1 < last):
        # RFC 9110 servers clamp a range that runs past the end.
        raise InvalidRangeError(
            f"range [{first}, {last + 1}) is past the end of a {cr.total}-byte object",
            service=service, path=redact_path(path))
    if cr is None or (cr.first, cr.last) != (first, last):
        raise refuse(f"Content-Range {_shown(headers.get('Content-Range'))} does not match "
                     f"the requested bytes {first}-{last}")
    length = headers.get("Content-Length")
    if length is not None and length.strip() != str(last - first + 1):
        raise refuse(f"Content-Length {_shown(length)} does not match the range")
    served = served_version(headers, cr.total)
    if pin is not None:
        pin.check(served, service=service, path=redact_path(path))
    return served


def needs_confirmation(pin: Pin | None, served: Pin) -> bool:
    """Whether an answer could not be tied to ``pin`` by its own headers: the
    pin has an ETag or a Last-Modified, and the answer carries neither to
    compare (a server that sends ETags on HEAD only and ignores If-Match could
    be serving another version)."""
    if pin is None or not pin.validated:
        return False
    if pin.etag is not None and served.etag is not None:
        return False
    return not (pin.mtime is not None and served.mtime is not None)


# -- redirects --------------------------------------------------------------------
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



#: What OpenSSL says when the "TLS" server answered with plain text (an HTTP port).
_PLAIN_TEXT_MARKERS = ("WRONG_VERSION_NUMBER", "wrong version number", "record layer failure",
                       "http request", "packet length too long")


def plain_text_answer(exc: BaseException) -> bool:
    """Whether a TLS error means the server spoke plain text (https:// to an http:// port)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if any(m in str(cur) for m in _PLAIN_TEXT_MARKERS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
