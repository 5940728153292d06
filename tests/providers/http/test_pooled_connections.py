"""Keep-alive connections a server closed or left bytes on: the next request
on one is sent again on a new connection, once, and reads exactly; an answer
that is no HTTP at all is a short ProtocolError."""

from __future__ import annotations

import os

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.errors import ProtocolError

pytestmark = pytest.mark.usefixtures("isolated_env")

DATA = os.urandom(600_000)
#: Ranged requests of 64 KiB, 4 at a time: several connections sit in the pool.
OPTIONS = {"stream_reads": False, "part_size": 64 << 10, "concurrency": 4, "retries": 1}


def _keep_alive_answer(method: str, headers: dict[str, str], *, after: bytes = b"",
                       head_body: bool = False) -> bytes:
    """An answer that says nothing of closing (HTTP/1.1: the connection stays
    open); the server closes it right after, as one does at its keep-alive
    timeout."""
    if method == "HEAD":
        head = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(DATA)}\r\nETag: \"v\"\r\n\r\n"
                .encode())
        return head + (DATA if head_body else b"") + after
    first, _, last = headers["range"].removeprefix("bytes=").partition("-")
    a, b = int(first), int(last) if last else len(DATA) - 1
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len(DATA)}\r\n"
            f"Content-Length: {b - a + 1}\r\nETag: \"v\"\r\n\r\n").encode() + DATA[a:b + 1] + after


def _read_in_pieces(url: str) -> bytes:
    with tensorstream.open(url, **OPTIONS) as f:
        return b"".join(f.read(150_000) for _ in range(0, len(DATA), 150_000))


@pytest.mark.parametrize("extra", [{}, {"after": b"\r\n"}, {"after": b"GARBAGE"},
                                   {"head_body": True}],
                         ids=["closed-while-idle", "crlf-after-body", "garbage-after-body",
                              "head-with-body"])
def test_pooled_connections_the_server_closed_or_left_bytes_on_are_replaced(
        extra: dict[str, object]) -> None:
    # Was AssertionError("unreachable") once two pooled connections were closed
    # (the repeat took the next idle one, closed too), and a permanent
    # ProtocolError (BadStatusLine) for bytes left after an answer.
    with RawHTTPServer(lambda m, h, n: _keep_alive_answer(m, h, **extra)) as server:  # type: ignore[arg-type]
        assert _read_in_pieces(server.url("m.bin")) == DATA


def test_a_status_line_of_kilobytes_is_quoted_short() -> None:
    # http.client quotes the whole line (up to 64 KiB); the message was that long.
    with RawHTTPServer(lambda m, h, n: b"X" * 20_000 + b"\r\n\r\n") as server, \
            pytest.raises(ProtocolError, match="BadStatusLine") as info:
        tensorstream.open(server.url("m.bin"), retries=1)
    assert len(str(info.value)) < 500
