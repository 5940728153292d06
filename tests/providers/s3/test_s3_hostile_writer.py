"""A hostile S3 endpoint's answers to a multipart upload (a raw server on
loopback): a CreateMultipartUpload with no UploadId, an UploadPart with no
ETag. Each is a ProtocolError naming what was missing (was a bare KeyError,
shown as just ``'UploadId'``/``'ETag'``), and a started upload is aborted."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.errors import NotFoundError, ProtocolError

pytestmark = pytest.mark.usefixtures("isolated_env")

MiB = 1 << 20
CREATED = (b'<?xml version="1.0"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>'
           b'<UploadId>U1</UploadId></InitiateMultipartUploadResult>')


def _answer(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"HTTP/1.1 {status}\r\n{lines}Content-Length: {len(body)}\r\nConnection: close"
            "\r\n\r\n").encode() + body


def _server(*, create: bytes, part_etag: bool) -> Callable[[str, dict[str, str], int], bytes]:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "POST":
            return _answer("200 OK", {}, create)
        if method == "PUT":
            return _answer("200 OK", {"ETag": '"0123"'} if part_etag else {})
        return _answer("204 No Content", {})  # the abort
    return respond


def _write(respond: Callable[[str, dict[str, str], int], bytes]) -> list[str]:
    with RawHTTPServer(respond) as server:
        options = {"s3_endpoint": f"http://127.0.0.1:{server.port}",
                   "s3_access_key_id": "AKIAEXAMPLE", "s3_secret_access_key": "x" * 40,
                   "s3_region": "us-east-1", "retries": 1, "part_size": 5 * MiB}
        with pytest.raises(ProtocolError) as info, \
                tensorstream.open("s3://b/k", "wb", **options) as f:
            f.write(os.urandom(11 * MiB))
        assert "S3 answered" in str(info.value), info.value
        return [f"{method} {info.value!s}" for method, _ in server.requests]


def test_a_create_without_an_upload_id_is_a_protocol_error() -> None:
    sent = _write(_server(create=CREATED.replace(b"<UploadId>U1</UploadId>", b""),
                          part_etag=True))
    assert "without an UploadId" in sent[-1]
    assert not any(s.startswith("PUT") for s in sent)  # no part went to an unnamed upload


def test_a_part_without_an_etag_is_a_protocol_error_and_the_upload_is_aborted() -> None:
    sent = _write(_server(create=CREATED, part_etag=False))
    assert "without an ETag" in sent[-1]
    assert any(s.startswith("DELETE") for s in sent)  # AbortMultipartUpload


def test_an_abort_answered_busy_is_retried_until_the_upload_is_gone() -> None:
    # The abort is what keeps orphaned parts from filling the bucket: a 503 on it
    # (a connection the cancelled parts broke, a busy service) is retried.
    deletes: list[int] = []

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "DELETE":
            deletes.append(attempt)
            if len(deletes) == 1:
                return _answer("503 Service Unavailable", {"Retry-After": "0"},
                               b"<Error><Code>SlowDown</Code></Error>")
        if method == "GET" and deletes:  # ListParts after the abort: the upload is gone
            return _answer("404 Not Found", {}, b"<Error><Code>NoSuchUpload</Code></Error>")
        return _server(create=CREATED, part_etag=False)(method, headers, attempt)

    sent = _write(respond)
    assert [s.split()[0] for s in sent].count("DELETE") == 2
    assert len(deletes) == 2
    assert [s.split()[0] for s in sent][-1] == "GET"  # looked at once, not aborted again


def test_an_upload_gone_is_not_called_a_missing_object() -> None:
    """The upload is gone when the write completes it (aborted by another: a lifecycle
    rule, ``aws s3api abort-multipart-upload``): S3's NoSuchUpload was said as ``no such
    object (NoSuchUpload)`` of the key being written, which was never read. It now says the
    multipart upload is gone (still a NotFoundError)."""
    posts: list[int] = []

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "POST":
            posts.append(attempt)
            if len(posts) == 1:
                return _answer("200 OK", {}, CREATED)
        if method == "PUT":
            return _answer("200 OK", {"ETag": '"0123"'})
        if method == "HEAD":
            return _answer("404 Not Found", {})
        return _answer("404 Not Found", {}, b"<Error><Code>NoSuchUpload</Code><Message>The "
                       b"specified upload does not exist.</Message></Error>")

    with RawHTTPServer(respond) as server:
        options = {"s3_endpoint": f"http://127.0.0.1:{server.port}",
                   "s3_access_key_id": "AKIAEXAMPLE", "s3_secret_access_key": "x" * 40,
                   "s3_region": "us-east-1", "retries": 1, "part_size": 5 * MiB}
        with pytest.raises(NotFoundError) as info, \
                tensorstream.open("s3://b/k", "wb", **options) as f:
            f.write(os.urandom(11 * MiB))
    text = str(info.value)
    assert "no such object" not in text, text
    assert "the multipart upload is gone (NoSuchUpload" in text, text
