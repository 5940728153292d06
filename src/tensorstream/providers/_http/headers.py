"""Small pure helpers of the HTTP data plane (:mod:`.range_get`), shared
by the HTTP and S3 providers: the check of a ranged answer (its status, range,
framing and version), the validators a pinned read sends, and a header view.

Kept free of I/O so they can be fuzzed and unit-tested on their own. Every helper
of the data plane is importable from here; the others live in
:mod:`.header_values` (header parsing), :mod:`.status_errors` (the one
status/exception -> tensorstream error mapping) and :mod:`.redirects` (redirect
targets, address checks).
"""

from __future__ import annotations

import email.utils
from datetime import timezone
from typing import Any

from ...errors import InvalidRangeError, ObjectChangedError, ProtocolError, TensorstreamError
from ..base import Pin
from .header_values import (
    ContentRange,
    Headers,
    etags_match,
    parse_content_range,
    parse_decimal,
    parse_http_date,
    parse_retry_after,
)
from .redirects import (
    REDIRECT_STATUSES,
    is_metadata_address,
    origin,
    redirect_step,
    refuse_metadata_target,
    wire_target,
)
from .status_errors import (
    CREDENTIALS_DROPPED,
    DROPPED_NOTE,
    exception_error,
    redact_path,
    status_error,
)

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


class LowerHeaders(dict[str, str]):
    """Headers from a mapping (botocore's lower-cased ``HTTPHeaders``), looked
    up case-insensitively like aiohttp's and http.client's."""

    def __init__(self, headers: Any) -> None:
        super().__init__((str(k).lower(), str(v)) for k, v in dict(headers).items())

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


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


def body_refusal(headers: Headers, *, stored_coding: bool = False) -> str | None:
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
        # (a .gz file served with its coding: Apache's AddEncoding, nginx's gzip_static)
        return (f"Content-Encoding {', '.join(content)} though asked for "
                "Accept-Encoding: identity (only the bytes as the server stores them are "
                "read); have the server send the file without a Content-Encoding (a .gz as "
                "application/gzip), or read it from where it is stored (S3 sends stored bytes)")
    transfer = (headers.get("Transfer-Encoding") or "").strip()
    if transfer.lower() not in ("", "chunked"):  # exactly what http.client un-chunks
        return f"Transfer-Encoding {transfer}"
    repeated = [n for n in _SINGLE_HEADERS if n in getattr(headers, "conflicting", ())]
    if repeated:
        return f"{', '.join(repeated)} given twice with different values"
    return None


def _shown(value: str | None, limit: int = 80) -> str:
    """A header value quoted in a message, cut to ``limit`` characters (a
    hostile server sends kilobytes of digits)."""
    if value is None or len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def served_version(headers: Headers, total: int | None) -> Pin:
    """The version an answer reports: its ETag, Last-Modified and total size."""
    return Pin(size=total, etag=headers.get("ETag"),
               mtime=parse_http_date(headers.get("Last-Modified")))


def check_ranged_response(status: int, headers: Headers, *, first: int, last: int,
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
