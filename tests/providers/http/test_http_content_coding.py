"""An HTTP(S) server that sends a file with a ``Content-Encoding`` though asked for
``identity`` (a ``.gz`` served as ``Content-Encoding: gzip``: Apache's ``AddEncoding``,
nginx's ``gzip_static``) is refused, as before, and the error now says what to do (it
said only "refusing a ranged body: Content-Encoding gzip"). S3's stored codings are
read as stored: tests/providers/s3/test_s3_stored_encoding.py."""

from __future__ import annotations

import gzip

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.cli.main import main

pytestmark = pytest.mark.usefixtures("isolated_env")

DATA = gzip.compress(bytes(range(256)) * 64)


def _respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
    if "range" not in headers:
        return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(DATA)}\r\nContent-Encoding: gzip"
                "\r\nETag: \"v1\"\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n"
                ).encode() + (b"" if method == "HEAD" else DATA)
    first, _, last = headers.get("range", "bytes=0-").partition("=")[2].partition("-")
    a, b = int(first or 0), min(int(last) if last else len(DATA) - 1, len(DATA) - 1)
    body = b"" if method == "HEAD" else DATA[a:b + 1]
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len(DATA)}\r\n"
            f"Content-Length: {b - a + 1}\r\nContent-Encoding: gzip\r\nETag: \"v1\"\r\n"
            "Connection: close\r\n\r\n").encode() + body


def test_a_content_coding_is_refused_saying_what_to_do(
        capsys: pytest.CaptureFixture[str]) -> None:
    with RawHTTPServer(_respond) as server:
        url = f"http://127.0.0.1:{server.port}/model.tar.gz"
        with pytest.raises(tensorstream.errors.TensorstreamError) as info:
            with tensorstream.open(url, retries=1) as f:
                f.read()
        code = main(["cat", url, "--retries", "1"])
    said = str(info.value)
    assert "Content-Encoding gzip" in said
    assert "without a Content-Encoding" in said and "Accept-Encoding: identity" in said
    assert code == 1 and "without a Content-Encoding" in capsys.readouterr().err
