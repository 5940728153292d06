"""The one-GET open (``sequential=True``) against a hand-written server that
answers hostile things: lying lengths and ranges, cuts at every stage,
content codings, duplicate headers, odd statuses, a resume of another total
or strength of ETag. Every read returns exactly the object's bytes or raises;
no secret of the URI reaches an exception, its causes or the log."""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Callable

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream import errors
from tensorstream.errors import TensorstreamError

pytestmark = pytest.mark.usefixtures("isolated_env")

SIZE = (1 << 20) + 17
DATA = os.urandom(SIZE)
OTHER = os.urandom(SIZE)
Respond = Callable[[str, dict[str, str], int], bytes]


def _answer(status: str, headers: dict[str, str | None], body: bytes = b"") -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if v is not None)
    return f"HTTP/1.1 {status}\r\n{lines}Connection: close\r\n\r\n".encode() + body


def _rng(headers: dict[str, str], size: int) -> tuple[int, int]:
    first_s, _, last_s = headers.get("range", "bytes=0-").removeprefix("bytes=").partition("-")
    return int(first_s), min(int(last_s), size - 1) if last_s else size - 1


def good(method: str, headers: dict[str, str], data: bytes = DATA, etag: str = '"v1"') -> bytes:
    size = len(data)
    if method == "HEAD":
        return _answer("200 OK", {"Content-Length": str(size), "ETag": etag,
                                  "Accept-Ranges": "bytes"})
    a, b = _rng(headers, size)
    return _answer("206 Partial Content", {"Content-Range": f"bytes {a}-{b}/{size}",
                                           "Content-Length": str(b - a + 1), "ETag": etag},
                   data[a:b + 1])


def _read(respond: Respond) -> tuple[bytes, list[tuple[str, dict[str, str]]]]:
    with RawHTTPServer(respond) as server:
        # backoff_max bounds the wait a Retry-After asks for (a huge one included)
        with tensorstream.open(server.url("m.bin"), sequential=True, backoff_max=1.0) as f:
            data = f.read()
        return data, server.requests


def exact_or_raise(respond: Respond, expected: bytes = DATA) -> None:
    try:
        data, _ = _read(respond)
    except TensorstreamError:
        return
    assert len(data) == len(expected)
    assert data == expected


def first_then_good(first: Callable[[dict[str, str]], bytes]) -> Respond:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 0:
            return first(headers)
        return good(method, headers)
    return respond


CR = f"bytes 0-{SIZE - 1}/{SIZE}"


def _chunked(body: bytes, size: int = 65536) -> bytes:
    out = b"".join(b"%x\r\n" % len(body[i:i + size]) + body[i:i + size] + b"\r\n"
                   for i in range(0, len(body), size))
    return out + b"0\r\n\r\n"

FIRSTS: dict[str, Callable[[dict[str, str]], bytes]] = {
    "200-cl-short": lambda h: _answer("200 OK", {"Content-Length": str(SIZE - 5), "ETag": '"v1"'},
                                      DATA[:SIZE - 5]),
    "200-cl-long-body": lambda h: _answer("200 OK", {"Content-Length": str(SIZE), "ETag": '"v1"'},
                                          DATA + b"extra"),
    "200-no-cl": lambda h: _answer("200 OK", {"ETag": '"v1"'}, DATA),
    "200-no-cl-short": lambda h: _answer("200 OK", {"ETag": '"v1"'}, DATA[:1000]),
    "206-no-cl-body-long": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                             "ETag": '"v1"'}, DATA + b"x" * 100),
    "206-no-cl-body-short": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                              "ETag": '"v1"'}, DATA[:5000]),
    "206-cl-lies-short": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                           "Content-Length": str(SIZE - 10), "ETag": '"v1"'},
                                           DATA),
    "206-cl-lies-long": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                          "Content-Length": str(SIZE + 10), "ETag": '"v1"'},
                                          DATA + b"0" * 10),
    "206-chunked-early-end": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n" % 70000 + DATA[:70000] + b"\r\n0\r\n\r\n"),
    "206-chunked-cut": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n" % SIZE + DATA[:70000]),
    "206-chunked-and-cl": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nContent-Length: " + str(SIZE).encode()
        + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n" % 70000 + DATA[:70000] + b"\r\n0\r\n\r\n"),
    "206-te-gzip-chunked": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n"
        + _chunked(gzip.compress(DATA))),
    "206-te-gzip-chunked-cl": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nContent-Length: " + str(SIZE).encode()
        + b"\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n"
        + _chunked(gzip.compress(DATA))),
    "206-te-gzip": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\n"
        + gzip.compress(DATA)),
    "206-ce-dup-identity-gzip": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nContent-Encoding: identity\r\nContent-Encoding: gzip"
        + b"\r\nConnection: close\r\n\r\n" + gzip.compress(DATA)),
    "206-te-identity-chunked": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nTransfer-Encoding: identity, chunked\r\nConnection: close"
        + b"\r\n\r\n" + _chunked(DATA)),
    "206-dup-te": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked"
        + b"\r\nConnection: close\r\n\r\n" + _chunked(_chunked(DATA))),
    "206-gzip": lambda h: _answer("206 Partial Content", {"Content-Range": CR, "ETag": '"v1"',
                                  "Content-Encoding": "gzip"}, gzip.compress(DATA)),
    "206-dup-cr": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nContent-Range: bytes 0-99/100\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n"
        + DATA),
    "206-dup-cl": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nContent-Length: " + str(SIZE).encode() + b"\r\nContent-Length: 100"
        + b"\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n" + DATA[:100]),
    "206-dup-etag": lambda h: (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: " + CR.encode()
        + b"\r\nETag: \"v1\"\r\nETag: \"v2\"\r\nConnection: close\r\n\r\n" + DATA),
    "206-total-zero": lambda h: _answer("206 Partial Content", {"Content-Range": "bytes 0-0/0",
                                        "ETag": '"v1"'}, b""),
    "206-star-total": lambda h: _answer("206 Partial Content",
                                        {"Content-Range": f"bytes 0-{SIZE - 1}/*",
                                         "ETag": '"v1"'}, DATA),
    "206-cut-in-headers": lambda h: b"HTTP/1.1 206 Partial Content\r\nContent-Ran",
    "206-cut-at-0": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                      "Content-Length": str(SIZE), "ETag": '"v1"'}),
    "206-cut-last-byte": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                           "Content-Length": str(SIZE), "ETag": '"v1"'},
                                           DATA[:-1]),
    "206-cut-mid": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                     "Content-Length": str(SIZE), "ETag": '"v1"'},
                                     DATA[:SIZE // 2]),
    "206-empty-etag": lambda h: _answer("206 Partial Content", {"Content-Range": CR,
                                        "Content-Length": str(SIZE), "ETag": ''}, DATA),
    "206-range-not-from-0": lambda h: _answer("206 Partial Content",
                                              {"Content-Range": f"bytes 5-{SIZE - 1}/{SIZE}",
                                               "ETag": '"v1"'}, DATA[5:]),
    "416": lambda h: _answer("416 Range Not Satisfiable", {"Content-Range": "bytes */0"}),
    "503-garbage-retry-after": lambda h: _answer("503 Unavailable",
                                                 {"Retry-After": "soon-ish", "Content-Length": "0"}),
    "503-huge-retry-after": lambda h: _answer("503 Unavailable",
                                              {"Retry-After": "99999999999999999999",
                                               "Content-Length": "0"}),
    "503-negative-retry-after": lambda h: _answer("503 Unavailable",
                                                  {"Retry-After": "-5", "Content-Length": "0"}),
    "302-no-location": lambda h: _answer("302 Found", {"Content-Length": "0"}),
    "500": lambda h: _answer("500 Oops", {"Content-Length": "0"}),
}


@pytest.mark.parametrize("name", list(FIRSTS))
def test_a_hostile_first_answer_then_good_ones_read_exactly(name: str) -> None:
    """Whatever the first GET answers, later answers are good: the open falls
    back to the HEAD, retries or resumes, and the bytes are exact."""
    data, _ = _read(first_then_good(FIRSTS[name]))
    assert len(data) == SIZE
    assert data == DATA


def test_a_resume_reporting_another_total_reads_exactly_or_raises() -> None:
    """The first answer is cut; the resume reports another total (same ETag)."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 0:
            return good(method, headers)[: 4000]
        return good(method, headers, data=DATA + b"more")
    exact_or_raise(respond)


def test_a_resume_of_another_etag_reads_exactly_or_raises() -> None:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 0:
            return good(method, headers)[: 4000]
        return good(method, headers, data=OTHER, etag='"v2"')
    exact_or_raise(respond)


def test_a_resume_answered_200_whole_reads_exactly_or_raises() -> None:
    """The resume's ranged GET is answered 200 with the whole object."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 0:
            return good(method, headers)[: 4000]
        if method == "HEAD":
            return good(method, headers)
        return _answer("200 OK", {"Content-Length": str(SIZE), "ETag": '"v1"'}, DATA)
    exact_or_raise(respond)


def test_a_resume_with_the_weak_form_of_the_etag_reads_exactly_or_raises() -> None:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 0:
            return good(method, headers)[: 4000]
        return good(method, headers, data=OTHER, etag='W/"v1"')
    exact_or_raise(respond)


def _later_ranged(extra: bytes, body: Callable[[bytes], bytes]) -> Respond:
    """The first GET is cut after 4000 bytes; later ranged GETs answer the
    right range with ``extra`` header lines and ``body(bytes of the range)``."""
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if attempt == 0 or method == "HEAD":
            return good(method, headers)[: 4000] if attempt == 0 else good(method, headers)
        a, b = _rng(headers, SIZE)
        return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{SIZE}\r\n"
                'ETag: "v1"\r\nConnection: close\r\n').encode() + extra + b"\r\n" \
            + body(DATA[a:b + 1])
    return respond


LATER: dict[str, Respond] = {
    "te-gzip-chunked": _later_ranged(b"Transfer-Encoding: gzip, chunked\r\n",
                                     lambda d: _chunked(gzip.compress(d))),
    "te-identity-chunked": _later_ranged(b"Transfer-Encoding: identity, chunked\r\n", _chunked),
    "ce-identity-then-gzip": _later_ranged(
        b"Content-Encoding: identity\r\nContent-Encoding: gzip\r\n", gzip.compress),
    "two-etags": _later_ranged(b'ETag: "v2"\r\n', lambda d: d),
}


def _later_status(status: str, headers: dict[str, str | None], times: int = 100) -> Respond:
    """The first GET is cut after 4000 bytes; the next ``times`` requests get ``status``."""
    def respond(method: str, h: dict[str, str], attempt: int) -> bytes:
        if attempt == 0:
            return good(method, h)[: 4000]
        if attempt <= times:
            return _answer(status, {"Content-Length": "0", **headers})
        return good(method, h)
    return respond


for _status in ("403 Forbidden", "404 Not Found", "410 Gone", "412 Precondition Failed",
                "416 Range Not Satisfiable", "500 Oops", "302 Found"):
    LATER[f"status-{_status.split()[0]}"] = _later_status(_status, {})
LATER["503-once-garbage-retry-after"] = _later_status("503 Busy", {"Retry-After": "nan"}, 1)
LATER["416-total-0"] = _later_status("416 Range Not Satisfiable", {"Content-Range": "bytes */0"})
LATER["302-to-itself"] = _later_status("302 Found", {"Location": "/m.bin"})


#: What each later answer must raise (absent: exact bytes or any tensorstream error).
LATER_RAISES: dict[str, type[Exception]] = {
    "status-403": errors.PermissionDeniedError, "status-404": errors.NotFoundError,
    "status-410": errors.NotFoundError, "status-412": errors.ObjectChangedError,
    # bytes inside the pinned size are past the end now: the object shrank
    "status-416": errors.ObjectChangedError, "416-total-0": errors.ObjectChangedError,
}


@pytest.mark.parametrize("name", list(LATER))
def test_a_hostile_ranged_answer_after_a_cut_reads_exactly_or_raises(name: str) -> None:
    if name in LATER_RAISES:
        with pytest.raises(LATER_RAISES[name]):
            _read(LATER[name])
    else:
        exact_or_raise(LATER[name])


def test_the_file_reads_like_bytesio_after_a_one_get_open() -> None:
    with RawHTTPServer(lambda m, h, a: good(m, h)) as server:
        f = tensorstream.open(server.url("m.bin"), sequential=True)
        assert f.read(10) == DATA[:10]
        f.seek(5)
        assert f.read(10) == DATA[5:15]
        f.seek(SIZE + 100)
        assert f.read(10) == b""
        f.seek(SIZE - 3)
        buf = bytearray(10)
        assert f.readinto(buf) == 3 and bytes(buf[:3]) == DATA[-3:]
        f.seek(0)
        buf = bytearray(7)
        assert f.readinto(buf) == 7 and bytes(buf) == DATA[:7]
        with pytest.raises((ValueError, OSError)):
            f.seek(-1)
        f.close()
        with pytest.raises(ValueError):
            f.read(1)
        with pytest.raises(ValueError):
            f.tell()
        f.read_stats()


SECRET = "s3cr3tPASS"
SIG = "0123456789abcdef" * 4
B64 = __import__("base64").b64encode(f"user:{SECRET}".encode()).decode()


@pytest.mark.parametrize("name", ["404", "403", "500", "cut", "redirect-loop", "redirect-other",
                                  "cut-in-headers", "echo-request-line", "echo-auth-long-line"])
def test_secrets_never_in_errors(name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if name in ("404", "403", "500"):
            return _answer(f"{name} X", {"Content-Length": "0"})
        if name == "cut":
            return good(method, headers)[:3000]
        if name == "redirect-loop":
            return _answer("302 Found", {"Location": f"/m.bin?X-Amz-Signature={SECRET}&n={attempt}",
                                         "Content-Length": "0"})
        if name == "redirect-other":
            return _answer("302 Found", {"Location": f"http://localhost:1/x?sig={SECRET}",
                                         "Content-Length": "0"})
        if name == "cut-in-headers":
            return b"HTTP/1.1 200 OK\r\nX-Thing: " + SECRET.encode()
        line = f"{method} /m.bin?X-Amz-Signature={SIG}&X-Amz-Credential=AKIA{SECRET} HTTP/1.1"
        if name == "echo-request-line":
            return line.encode() + b"\r\n\r\n"
        auth = headers.get("authorization", "")
        return (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n" + b"x" * 70000
                + f"Authorization: {auth}\r\n\r\nabc".encode())

    with RawHTTPServer(respond) as server:
        url = server.url("m.bin").replace("http://", f"http://user:{SECRET}@") \
            + f"?X-Amz-Signature={SIG}&X-Amz-Credential=AKIA{SECRET}"
        with pytest.raises(Exception) as info:
            with tensorstream.open(url, sequential=True) as f:
                f.read()
    exc: BaseException | None = info.value
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for secret in (SECRET, SIG, B64):
            assert secret not in str(exc), (name, str(exc))
            assert secret not in repr(exc), (name, repr(exc))
            for a in getattr(exc, "args", ()):
                assert secret not in str(a)
        exc = exc.__cause__ or exc.__context__
    for secret in (SECRET, SIG, B64):
        assert secret not in caplog.text, caplog.text


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut-and-resumed"])
def test_credentials_never_follow_a_redirect_to_another_origin(cut: bool) -> None:
    """The URI's userinfo is sent to its own origin only: not to the origin a
    redirect names, on the first GET, a fallback HEAD or a resume."""
    gets = [0]

    def b_respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        gets[0] += method == "GET"
        answer = good(method, headers)
        return answer[:4000] if cut and gets[0] == 1 and method == "GET" else answer

    with RawHTTPServer(b_respond) as b:
        def a_respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
            return _answer("302 Found", {"Location": b.url("m.bin"), "Content-Length": "0"})

        with RawHTTPServer(a_respond) as a:
            url = a.url("m.bin").replace("http://", f"http://user:{SECRET}@")
            with tensorstream.open(url, sequential=True, allow_private_redirects=True) as f:
                assert f.read() == DATA
            assert all("authorization" in h for _, h in a.requests)
        assert b.requests and not [h for _, h in b.requests if "authorization" in h]
