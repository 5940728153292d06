"""A hostile HTTP server's headers against ``tensorstream.open``: numbers
``int()`` refuses (thousands of digits: Python's digit limit; Latin-1
digits ``str.isdigit`` takes), dates past what a datetime holds, redirects
to a port out of range. Each must be a tensorstream error or a correct
read, never a bare ValueError/OverflowError."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.errors import InsufficientMemoryError, ProtocolError, StorageTimeoutError

pytestmark = pytest.mark.usefixtures("isolated_env")

DATA = os.urandom(1000)
Respond = Callable[[str, dict[str, str], int], bytes]


def _answer(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 {status}\r\n{lines}Connection: close\r\n\r\n".encode("latin-1") + body


def _server(*, head: dict[str, str], total: str = str(len(DATA)),
            extra: dict[str, str] | None = None) -> Respond:
    """HEAD answers ``head``; a ranged GET answers its bytes with ``total``
    as the Content-Range total (and ``extra`` headers)."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":
            return _answer("200 OK", head)
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        a, b = int(first), int(last) if last else len(DATA) - 1
        return _answer("206 Partial Content", {
            "ETag": '"v"', "Content-Length": str(b - a + 1),
            "Content-Range": f"bytes {a}-{b}/{total}", **(extra or {})}, DATA[a:b + 1])
    return respond


def _read(respond: Respond) -> bytes:
    with RawHTTPServer(respond) as server, \
            tensorstream.open(server.url("m.bin"), retries=1) as f:
        return f.read()


@pytest.mark.parametrize("length", ["9" * 5000, "\xb2", "\xb9\xb2\xb3"],
                         ids=["5000-digits", "superscript-two", "superscripts"])
def test_a_head_length_int_refuses_is_no_size_and_the_probe_decides(length: str) -> None:
    # Was ValueError (digit limit / "invalid literal for int()"): the size is now
    # unusable, so the ranged probe tells it, as for a HEAD without a length.
    assert _read(_server(head={"Content-Length": length, "ETag": '"v"'})) == DATA


def test_a_content_range_total_of_thousands_of_digits_is_a_protocol_error() -> None:
    respond = _server(head={"Content-Length": str(len(DATA)), "ETag": '"v"'},
                      total="9" * 5000)
    with pytest.raises(ProtocolError, match="Content-Range") as info:
        _read(respond)
    assert len(str(info.value)) < 500  # the header is cut, not echoed whole


@pytest.mark.parametrize("cr", ["bytes 0-999/" + "0" * 5000 + "1000", "bytes 0-" + "9" * 5000 + "/1000"],
                         ids=["zero-padded-total", "5000-digit-last"])
def test_odd_content_range_numbers_are_protocol_errors(cr: str) -> None:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":
            return _answer("200 OK", {"Content-Length": "1000", "ETag": '"v"'})
        return _answer("206 Partial Content", {"ETag": '"v"', "Content-Range": cr,
                                               "Content-Length": "1000"}, DATA)
    with pytest.raises(ProtocolError):
        _read(respond)


def test_a_last_modified_at_the_edge_of_datetime_reads_the_bytes() -> None:
    date = "Fri, 31 Dec 9999 23:59:59 -2359"
    # Was OverflowError ("date value out of range"): the pinned reads send the
    # date back as If-Unmodified-Since, in UTC, where it is past datetime's range.
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":
            return _answer("200 OK", {"Content-Length": "1000", "Last-Modified": date})
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        a, b = int(first), int(last) if last else len(DATA) - 1
        return _answer("206 Partial Content", {
            "Last-Modified": date, "Content-Length": str(b - a + 1),
            "Content-Range": f"bytes {a}-{b}/{len(DATA)}"}, DATA[a:b + 1])
    assert _read(respond) == DATA


@pytest.mark.parametrize("location", ["http://127.0.0.1:99999/m.bin", "http://127.0.0.1:-1/m.bin",
                                      "http://127.0.0.1:http/m.bin"],
                         ids=["port-99999", "port-negative", "port-name"])
def test_a_redirect_to_a_port_out_of_range_is_a_protocol_error(location: str) -> None:
    # Was a bare ValueError ("Port out of range 0-65535") from yarl, parsed lazily.
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return _answer("302 Found", {"Location": location, "Content-Length": "0"})
    with pytest.raises(ProtocolError, match="malformed Location") as info:
        _read(respond)
    assert location not in str(info.value)  # a Location is never echoed



@pytest.mark.parametrize("sep", [" ", "\x01", "\x7f"], ids=["space", "ctrl-a", "del"])
def test_a_redirect_echoing_the_authorization_is_refused_without_the_token(sep: str) -> None:
    # Was ProtocolError("HTTP client error (InvalidURL: URL can't contain control
    # characters. '/next?echo=Bearer <token>' ...)"): http.client quotes the URL, and
    # a same-origin Location may echo the Authorization header that was sent.
    token = "tok-echoed-in-location-4f1d"

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        echoed = headers.get("authorization", "").replace(" ", sep)
        return _answer("302 Found", {"Location": f"/next?echo={echoed}", "Content-Length": "0"})
    with RawHTTPServer(respond) as server, \
            pytest.raises(ProtocolError, match="malformed Location") as info:
        tensorstream.open(server.url("m.bin"), retries=1, token=token)
    assert token not in "".join(traceback.format_exception(info.value))


HUGE = "999999999999999999"  # 18 digits: a size, of 888 PiB


def _huge_object(method: str, headers: dict[str, str], attempt: int) -> bytes:
    if method == "HEAD":
        return _answer("200 OK", {"Content-Length": HUGE, "ETag": '"v"'})
    first, _, last = headers["range"].removeprefix("bytes=").partition("-")
    a, b = int(first), int(last) if last else int(HUGE) - 1
    n = min(b - a + 1, 1000)  # never sent whole: the read must refuse first
    return _answer("206 Partial Content", {"ETag": '"v"', "Content-Length": str(b - a + 1),
                                           "Content-Range": f"bytes {a}-{b}/{HUGE}"}, DATA[:n])


def test_read_of_an_object_claiming_more_than_memory_holds_is_refused() -> None:
    # Was a bare MemoryError from bytearray(10**18) in read().
    with pytest.raises(InsufficientMemoryError, match=r"read it in parts") as info:
        _read(_huge_object)
    assert info.value.claimed == int(HUGE)


def test_read_range_past_memory_is_refused() -> None:
    with RawHTTPServer(_huge_object) as server, pytest.raises(InsufficientMemoryError):
        asyncio.run(tensorstream.read_range(server.url("m.bin"), 0, int(HUGE), retries=1))


def _slow_head(method: str, headers: dict[str, str], attempt: int) -> Any:
    """HEAD answers at once; a GET's status line arrives, then a header one byte
    every 20 ms, without end (each byte well inside ``timeout_idle``)."""
    if method == "HEAD":
        return _answer("200 OK", {"Content-Length": str(len(DATA)), "ETag": '"v"'})

    def pieces() -> Iterator[bytes | float]:
        yield b"HTTP/1.1 206 Partial Content\r\nX-Pad: "
        while True:
            yield b"a"
            yield 0.02
    return pieces()


_DOORS: dict[str, Callable[[str], Any]] = {
    "open": lambda url: tensorstream.open(url, retries=1, timeout_idle=10,
                                          timeout_total=1).read(),
    "sequential": lambda url: tensorstream.open(url, sequential=True, retries=1,
                                                timeout_idle=10, timeout_total=1).read(),
    "read_range": lambda url: asyncio.run(tensorstream.read_range(
        url, 0, len(DATA), retries=1, timeout_idle=10, timeout_total=1)),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("door", list(_DOORS))
def test_headers_that_trickle_cannot_hold_a_read_past_timeout_total(door: str) -> None:
    # Was a hang: http.client reads the head with the socket timeout on each
    # receive, so a byte every 20 ms kept it going past timeout_total, for ever.
    with RawHTTPServer(_slow_head) as server:
        t0 = time.monotonic()
        with pytest.raises(StorageTimeoutError, match="timeout_total"):
            _DOORS[door](server.url("m.bin"))
        assert time.monotonic() - t0 < 5


@pytest.mark.timeout(30)
def test_endless_100_continue_answers_are_a_protocol_error() -> None:
    # Was a hang without timeout_total: http.client skips any number of
    # "100 Continue" heads, each arriving well inside timeout_idle.
    def respond(method: str, headers: dict[str, str], attempt: int) -> Any:
        if method == "HEAD":
            return _answer("200 OK", {"Content-Length": str(len(DATA)), "ETag": '"v"'})
        return itertools.repeat(b"HTTP/1.1 100 Continue\r\n\r\n" * 1000)
    with pytest.raises(ProtocolError, match="status line and headers"):
        _read(respond)


@pytest.mark.parametrize("interim", ["103 Early Hints\r\nLink: </m.json>; rel=preload",
                                     "102 Processing", "103 Early Hints\r\n\r\nHTTP/1.1 100 Continue"],
                         ids=["103", "102", "103-then-100"])
@pytest.mark.parametrize("sequential", [False, True], ids=["open", "sequential"])
def test_informational_answers_before_the_answer_are_skipped(interim: str,
                                                             sequential: bool) -> None:
    # RFC 9110 15.2: a client must parse 1xx answers it did not ask for. Every
    # read failed with "unexpected HTTP 103 Early Hints" (http.client skips 100 only).
    inner = _server(head={"Content-Length": str(len(DATA)), "ETag": '"v"'})

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return f"HTTP/1.1 {interim}\r\n\r\n".encode("latin-1") + inner(method, headers, attempt)
    with RawHTTPServer(respond) as server, \
            tensorstream.open(server.url("m.bin"), sequential=sequential, retries=1) as f:
        assert f.read() == DATA
    with RawHTTPServer(respond) as server:
        assert asyncio.run(tensorstream.read_range(server.url("m.bin"), 10, 20,
                                                   retries=1)) == DATA[10:20]


def test_an_object_without_validators_is_read_with_a_warning_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # Neither ETag nor Last-Modified: a replacement by an object of the same size
    # between two requests of a read cannot be told apart, and the reads said
    # nothing of it (docs promised "never a mix of versions").
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":
            return _answer("200 OK", {"Content-Length": str(len(DATA))})
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        a, b = int(first), int(last) if last else len(DATA) - 1
        return _answer("206 Partial Content", {
            "Content-Length": str(b - a + 1), "Content-Range": f"bytes {a}-{b}/{len(DATA)}"},
            DATA[a:b + 1])
    with RawHTTPServer(respond) as server, caplog.at_level("WARNING", "tensorstream.http"):
        for _ in range(3):
            with tensorstream.open(server.url("m.bin?X-Sig=s3cr3t"), retries=1) as f:
                assert f.read() == DATA
    said = [r.getMessage() for r in caplog.records if "neither ETag nor Last-Modified" in r.getMessage()]
    assert len(said) == 1
    assert "/m.bin" in said[0] and "s3cr3t" not in said[0]


@pytest.mark.parametrize(("validators", "warned"), [
    ({"ETag": 'W/"v1"'}, True),
    ({"ETag": ' W/"v1"'}, True),
    ({"ETag": 'W/"v1"', "Last-Modified": "Mon, 07 Dec 2026 10:00:00 GMT"}, False),
    ({"ETag": '"v1"'}, False),
])
def test_an_object_with_only_a_weak_etag_is_read_with_a_warning_once(
        caplog: pytest.LogCaptureFixture, validators: dict[str, str], warned: bool) -> None:
    """A weak ETag (``W/"..."``) says two versions are equivalent, not the same bytes: with
    no Last-Modified beside it, parts of two versions under one weak ETag could be read as
    one object, and nothing was said. Warned once per object, as with no validator."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":
            return _answer("200 OK", {"Content-Length": str(len(DATA)), **validators})
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        a, b = int(first), int(last) if last else len(DATA) - 1
        return _answer("206 Partial Content", {
            "Content-Length": str(b - a + 1), "Content-Range": f"bytes {a}-{b}/{len(DATA)}",
            **validators}, DATA[a:b + 1])
    with RawHTTPServer(respond) as server, caplog.at_level("WARNING", "tensorstream.http"):
        for name in ("w.bin", "w.bin", "x.bin"):
            with tensorstream.open(server.url(f"{name}?X-Sig=s3cr3t"), retries=1) as f:
                assert f.read() == DATA
    said = [r.getMessage() for r in caplog.records if "weak ETag" in r.getMessage()]
    assert len(said) == (2 if warned else 0), said
    assert all("s3cr3t" not in m for m in said)
    if warned:
        assert "/w.bin" in said[0] and "/x.bin" in said[1]
        assert not any("neither ETag" in r.getMessage() for r in caplog.records)
