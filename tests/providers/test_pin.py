""":class:`tensorstream.providers.base.Pin` decides whether an answer is of the
version a read is pinned to: the rules every HTTP, S3 and third-party read
relies on to never mix two versions."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tensorstream.errors import ObjectChangedError
from tensorstream.providers.base import Pin

MONDAY = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
TUESDAY = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)


def test_a_strong_etag_decides_alone_whatever_the_dates() -> None:
    Pin(size=3, etag='"a"', mtime=MONDAY).check(Pin(size=3, etag='"a"', mtime=TUESDAY))
    with pytest.raises(ObjectChangedError, match="ETag"):
        Pin(size=3, etag='"a"', mtime=MONDAY).check(Pin(size=3, etag='"b"', mtime=MONDAY))


@pytest.mark.parametrize(("pinned", "served"), [
    ('W/"a"', 'W/"a"'), ('W/"a"', '"a"'), ('"a"', 'W/"a"')])
def test_a_weak_etag_is_not_byte_identity_so_the_date_is_compared_too(
        pinned: str, served: str) -> None:
    Pin(size=3, etag=pinned, mtime=MONDAY).check(Pin(size=3, etag=served, mtime=MONDAY))
    with pytest.raises(ObjectChangedError, match="Last-Modified"):
        Pin(size=3, etag=pinned, mtime=MONDAY).check(Pin(size=3, etag=served, mtime=TUESDAY))


def test_a_size_change_is_a_change_whatever_the_validators() -> None:
    with pytest.raises(ObjectChangedError, match="size 4, was 3"):
        Pin(size=3, etag='"a"').check(Pin(size=4, etag='"a"'))


def test_fields_unknown_on_one_side_are_not_compared() -> None:
    Pin(size=3, etag='"a"').check(Pin(size=3))
    Pin(size=3).check(Pin(size=3, etag='"b"', mtime=TUESDAY))
    Pin(size=3, etag='"a"', mtime=MONDAY).check(Pin(size=3, mtime=MONDAY))


@pytest.mark.parametrize("served", [
    Pin(size=3), Pin(size=3, mtime=MONDAY), Pin(size=None)])
def test_a_confirmation_without_the_pinned_validator_is_a_change(served: Pin) -> None:
    """The confirmation stands in for an answer that named no version: one that
    does not name it either cannot confirm the bytes are of the pinned one."""
    with pytest.raises(ObjectChangedError, match="no longer reports"):
        Pin(size=3, etag='"a"').check(served, confirming=True)


def test_a_confirmation_with_a_comparable_validator_confirms() -> None:
    Pin(size=3, etag='"a"').check(Pin(size=3, etag='"a"'), confirming=True)
    Pin(size=3, mtime=MONDAY).check(Pin(size=3, mtime=MONDAY), confirming=True)
    Pin(size=3, etag='"a"', mtime=MONDAY).check(Pin(size=3, mtime=MONDAY), confirming=True)
    Pin(size=3).check(Pin(size=3), confirming=True)  # nothing pinned but the size
    with pytest.raises(ObjectChangedError, match="Last-Modified"):
        Pin(size=3, mtime=MONDAY).check(Pin(size=3, mtime=TUESDAY), confirming=True)


@pytest.mark.parametrize(("pinned", "served"), [('"a"', 'W/"a"'), ('W/"a"', '"a"')])
@pytest.mark.parametrize("dates", [(None, None), (MONDAY, None), (None, MONDAY)],
                         ids=["none", "pin-only", "served-only"])
def test_a_weak_and_a_strong_etag_without_both_dates_are_not_the_same_version(
        pinned: str, served: str, dates: tuple[datetime | None, datetime | None]) -> None:
    """Strong comparison of ``"a"`` and ``W/"a"`` fails (a server honouring
    If-Match refuses): without both dates nothing says the bytes are the same."""
    with pytest.raises(ObjectChangedError, match="ETag"):
        Pin(size=3, etag=pinned, mtime=dates[0]).check(Pin(size=3, etag=served, mtime=dates[1]))


def test_equal_weak_etags_without_dates_are_still_the_same_version() -> None:
    Pin(size=3, etag='W/"a"').check(Pin(size=3, etag='W/"a"'))
