"""The values HTTP headers carry, parsed as the data plane reads them (byte counts,
``Content-Range``, dates, ``Retry-After``, ETags): pure functions, no I/O, so they
can be fuzzed and unit-tested on their own."""

from __future__ import annotations

import email.utils
import re
import time
from datetime import datetime, timezone
from typing import Any, NamedTuple

__all__ = [
    "ContentRange",
    "Headers",
    "etags_match",
    "parse_content_range",
    "parse_decimal",
    "parse_http_date",
    "parse_retry_after",
]

#: Case-insensitive headers with ``.get(name)`` (the data plane's header view,
#: or http.client's HTTPMessage).
Headers = Any

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
