"""The one-GET open (``sequential=True``) against servers that lie about the
version on a resume: after a cut, the rest of the body must be of the version
the first answer reported, or the read raises. Never a mix of two versions."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.errors import ObjectChangedError

pytestmark = pytest.mark.usefixtures("isolated_env")

SIZE = (3 << 20) + 17
OLD = os.urandom(SIZE)
NEW = os.urandom(SIZE)
CUT = 1 << 20
MONDAY = "Mon, 30 Nov 2026 08:00:00 GMT"
TUESDAY = "Tue, 01 Dec 2026 08:00:00 GMT"


def _answer(status: str, headers: dict[str, str | None], body: bytes = b"") -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if v is not None)
    return f"HTTP/1.1 {status}\r\n{lines}Connection: close\r\n\r\n".encode() + body


def _server(*, first: dict[str, str | None], later: dict[str, str | None], later_data: bytes,
            head: dict[str, str | None]) -> Callable[[str, dict[str, str], int], bytes]:
    """The first GET (``bytes=0-``) answers ``OLD`` with the ``first`` validators
    and is cut after ``CUT`` bytes; later GETs answer ``later_data`` with the
    ``later`` validators; a HEAD answers the ``head`` validators."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":
            return _answer("200 OK", {"Content-Length": str(SIZE), **head})
        first_s, _, last_s = headers["range"].removeprefix("bytes=").partition("-")
        a, b = int(first_s), int(last_s) if last_s else SIZE - 1
        cr = {"Content-Range": f"bytes {a}-{b}/{SIZE}", "Content-Length": str(b - a + 1)}
        if attempt == 0:
            return _answer("206 Partial Content", {**cr, **first}, OLD[a:b + 1])[:CUT]
        return _answer("206 Partial Content", {**cr, **later}, later_data[a:b + 1])
    return respond


def _read(respond: Callable[[str, dict[str, str], int], bytes]) -> tuple[bytes, list[str]]:
    with RawHTTPServer(respond) as server:
        with tensorstream.open(server.url("m.bin"), sequential=True) as f:
            data = f.read()
        return data, [method for method, _ in server.requests]


@pytest.mark.parametrize("head", [
    {},                                       # the HEAD names no version either
    {"Last-Modified": MONDAY},                # nor one the pin can be compared with
], ids=["nothing", "date-only"])
def test_a_resume_that_names_no_version_and_cannot_be_confirmed_raises(
        head: dict[str, str | None]) -> None:
    respond = _server(first={"ETag": '"v1"'}, later={}, later_data=NEW, head=head)
    with pytest.raises(ObjectChangedError, match="no longer reports"):
        _read(respond)


def test_a_resume_that_names_no_version_is_confirmed_by_the_head() -> None:
    respond = _server(first={"ETag": '"v1"'}, later={}, later_data=OLD, head={"ETag": '"v1"'})
    data, methods = _read(respond)
    assert data == OLD
    assert "HEAD" in methods  # the confirmation was asked for


def test_a_resume_whose_head_reports_another_etag_raises() -> None:
    respond = _server(first={"ETag": '"v1"'}, later={}, later_data=NEW, head={"ETag": '"v2"'})
    with pytest.raises(ObjectChangedError, match="ETag"):
        _read(respond)


def test_an_equal_weak_etag_with_a_new_date_is_another_version() -> None:
    respond = _server(first={"ETag": 'W/"v1"', "Last-Modified": MONDAY},
                      later={"ETag": 'W/"v1"', "Last-Modified": TUESDAY}, later_data=NEW,
                      head={"ETag": 'W/"v1"', "Last-Modified": TUESDAY})
    with pytest.raises(ObjectChangedError, match="Last-Modified"):
        _read(respond)


def test_an_equal_weak_etag_with_the_same_date_resumes_exactly() -> None:
    both = {"ETag": 'W/"v1"', "Last-Modified": MONDAY}
    respond = _server(first=both, later=both, later_data=OLD, head=both)
    data, _ = _read(respond)
    assert data == OLD


def test_an_equal_strong_etag_resumes_exactly_whatever_the_date() -> None:
    respond = _server(first={"ETag": '"v1"', "Last-Modified": MONDAY},
                      later={"ETag": '"v1"', "Last-Modified": TUESDAY}, later_data=OLD,
                      head={"ETag": '"v1"'})
    data, _ = _read(respond)
    assert data == OLD


@pytest.mark.parametrize(("first", "later"), [('"v1"', 'W/"v1"'), ('W/"v1"', '"v1"')],
                         ids=["strong-then-weak", "weak-then-strong"])
def test_a_resume_with_the_other_strength_of_the_etag_and_no_dates_raises(
        first: str, later: str) -> None:
    """``"v1"`` and ``W/"v1"`` fail strong comparison (If-Match was ignored):
    without dates to compare, the resumed bytes may be another version's."""
    respond = _server(first={"ETag": first}, later={"ETag": later}, later_data=NEW,
                      head={"ETag": later})
    with pytest.raises(ObjectChangedError, match="ETag"):
        _read(respond)
