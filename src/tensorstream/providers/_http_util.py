"""Small pure helpers for the HTTP provider: header parsing and address checks.

Kept free of I/O so they can be fuzzed and unit-tested on their own.
"""

from __future__ import annotations

import email.utils
import ipaddress
import re
import time
from datetime import datetime, timezone
from typing import NamedTuple

__all__ = [
    "ContentRange",
    "etags_match",
    "is_metadata_address",
    "parse_content_range",
    "parse_http_date",
    "parse_retry_after",
]

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", re.IGNORECASE)


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
    first = int(m.group(1)) if m.group(1) is not None else None
    last = int(m.group(2)) if m.group(2) is not None else None
    total = int(m.group(3)) if m.group(3) != "*" else None
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
    except (TypeError, ValueError, IndexError):
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt


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
