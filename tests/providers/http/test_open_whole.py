"""``tensorstream.open(..., sequential=True)`` over HTTP takes the size and
validators from its first GET (``Range: bytes=0-``) and keeps that body as the
reader's first stream; without ``sequential`` it sends the ``HEAD`` as always.
Every guarantee of the ``HEAD`` it replaces holds: the reader is pinned to the
version that GET reported, an answer that cannot stand in for a ``HEAD`` falls
back to one, statuses map as before, and temporary errors are retried."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

import tensorstream
from fixtures_http import HTTP_TEST_TOKEN
from tensorstream.errors import NotFoundError, ObjectChangedError, PermissionDeniedError
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom(3 << 20)


def _put(server: HTTPTestServer, data: bytes = DATA) -> str:
    key = f"whole-{uuid.uuid4().hex[:8]}"
    server.put(key, data)
    return key


def _methods(server: HTTPTestServer, key: str) -> list[tuple[str, str | None]]:
    return [(r.method, dict(r.headers).get("Range")) for r in server.requests_for(key)]


def test_one_get_gives_size_validators_and_the_stream(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        assert f.size == len(DATA) and f.etag
        assert f.read() == DATA
    assert _methods(http_server, key) == [("GET", "bytes=0-")]


def test_without_sequential_open_sends_the_head_and_no_get(
        http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    with tensorstream.open(http_server.url(key), **http_server.options) as f:
        assert f.size == len(DATA)
        assert _methods(http_server, key) == [("HEAD", None)]
        assert f.read(4096) == DATA[:4096]
    assert ("GET", "bytes=0-") not in _methods(http_server, key)


def test_a_replaced_object_is_an_error_never_a_mix(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        http_server.put(key, bytes(b ^ 0xFF for b in DATA))  # after the first GET
        f.seek(len(DATA) - (1 << 20))  # a jump: a ranged GET pinned to the first answer
        with pytest.raises(ObjectChangedError):
            f.read(4096)
    gets = [r for r in http_server.requests_for(key, "GET")]
    assert "If-Match" in dict(gets[-1].headers) or "If-Unmodified-Since" in dict(gets[-1].headers)


def test_no_validators_falls_back_to_head(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.no_etag = True
    http_server.faults.no_last_modified = True
    url = http_server.url(key)
    before = tensorstream.open(url, sequential=True, **http_server.options)
    before.close()
    methods = [m for m, _ in _methods(http_server, key)]
    assert methods[:2] == ["GET", "HEAD"], methods


def test_a_server_ignoring_ranges_falls_back_to_head(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.ignore_range = True
    try:
        with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
            assert f.size == len(DATA)  # from the HEAD, as before
    except tensorstream.errors.ProtocolError:
        pass  # reads may refuse a server without ranges; the size came from the HEAD
    assert [m for m, _ in _methods(http_server, key)][:2] == ["GET", "HEAD"]


def test_missing_object_maps_as_before(http_server: HTTPTestServer) -> None:
    with pytest.raises(NotFoundError):
        tensorstream.open(http_server.url(f"absent-{uuid.uuid4().hex[:8]}"), sequential=True,
                          **http_server.options)


def test_empty_object(http_server: HTTPTestServer) -> None:
    key = _put(http_server, b"")
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        assert f.size == 0 and f.read() == b""


def test_temporary_errors_on_the_first_get_are_retried(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.status_script = [503, 503]
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        assert f.read() == DATA
    assert [m for m, _ in _methods(http_server, key)][:3] == ["GET", "GET", "GET"]


def test_a_cut_first_body_is_resumed_exactly_and_pinned(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.key = key
    http_server.faults.drop_after, http_server.faults.drop_times = 300_000, 1
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        assert f.read() == DATA
    gets = http_server.requests_for(key, "GET")
    assert http_server.faults.dropped == 1 and len(gets) == 2
    assert gets[0].headers["Range"] == "bytes=0-"
    # The rest, pinned to the version open's GET reported.
    assert gets[1].headers["Range"] == f"bytes=300000-{len(DATA) - 1}"
    assert gets[1].headers["If-Match"] == http_server.etag(key)


def test_a_refused_first_get_maps_as_the_head_does(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.key = key
    http_server.faults.status_script = [403, 403, 403]
    with pytest.raises(PermissionDeniedError):
        tensorstream.open(http_server.url(key), sequential=True, **http_server.options)
    # Then stat as before: the HEAD, and the GET probe a refused HEAD gets.
    assert _methods(http_server, key) == [("GET", "bytes=0-"), ("HEAD", None),
                                          ("GET", "bytes=0-0")]


@pytest.mark.parametrize("fault", ["etag_on_head_only", "no_etag"])
def test_a_get_without_an_etag_leaves_the_pin_to_the_head(
        fault: str, http_server: HTTPTestServer) -> None:
    # Last-Modified alone would pin the reads more weakly than the HEAD's ETag
    # (and its confirmations) do: the HEAD decides, as before.
    key = _put(http_server)
    http_server.faults.key = key
    setattr(http_server.faults, fault, True)
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        assert f.read() == DATA
        assert (f.etag is not None) == (fault == "etag_on_head_only")
    assert [m for m, _ in _methods(http_server, key)][:2] == ["GET", "HEAD"]


@pytest.mark.parametrize("fault", ["wrong_content_range", "gzip"])
def test_an_answer_that_cannot_stand_in_falls_back_to_head(
        fault: str, http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.key = key
    setattr(http_server.faults, fault, True)
    try:
        with tensorstream.open(http_server.url(key), sequential=True,
                               **http_server.options) as f:
            assert f.size == len(DATA)  # from the HEAD
            assert f.read(4096) == DATA[:4096]
    except tensorstream.errors.TensorstreamError:
        pass  # reads may refuse such a server; exact or an error, never other bytes
    assert [m for m, _ in _methods(http_server, key)][:2] == ["GET", "HEAD"]


def test_a_chunked_answer_stands_in_and_reads_exactly(http_server: HTTPTestServer) -> None:
    key = _put(http_server)
    http_server.faults.key = key
    http_server.faults.no_content_length = True  # a 206 of every byte, chunked
    with tensorstream.open(http_server.url(key), sequential=True, **http_server.options) as f:
        assert f.size == len(DATA) and f.read() == DATA
    assert _methods(http_server, key) == [("GET", "bytes=0-")]


def test_a_redirect_is_followed_and_credentials_stay_at_the_first_origin(
        http_server: HTTPTestServer, https_server: HTTPTestServer) -> None:
    key = f"whole-{uuid.uuid4().hex[:8]}"
    https_server.put(key, DATA)
    http_server.faults.redirect_to = https_server.base_url
    with tensorstream.open(http_server.url(key), sequential=True, token=HTTP_TEST_TOKEN,
                           ca_bundle=https_server.ca_bundle_path) as f:
        assert f.size == len(DATA) and f.read() == DATA
    first = http_server.requests_for(key)[0]
    assert first.status == 307 and dict(first.headers).get("Range") == "bytes=0-"
    landed = https_server.requests_for(key)
    assert (landed[0].method, dict(landed[0].headers).get("Range")) == ("GET", "bytes=0-")
    assert all("Authorization" not in r.headers for r in landed)


@pytest.mark.parametrize("sequential", [True, False], ids=["one-get", "head"])
def test_reads_from_several_threads_are_each_whole_and_never_mixed(
        http_server: HTTPTestServer, sequential: bool) -> None:
    """Threads sharing one reader: every ``read(n)`` returns the ``n`` bytes at
    one position (the position it moved past), none twice, none skipped."""
    key = _put(http_server)
    piece = 64 << 10
    offsets = {DATA[i:i + piece]: i for i in range(0, len(DATA), piece)}
    got: list[int] = []
    errors: list[BaseException] = []
    with tensorstream.open(http_server.url(key), sequential=sequential,
                           **http_server.options) as f:
        def work() -> None:
            try:
                while data := f.read(piece):
                    assert data in offsets, f"a read of {len(data)} bytes matched no position"
                    got.append(offsets[data])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors[0]
    assert sorted(got) == sorted(offsets.values())
