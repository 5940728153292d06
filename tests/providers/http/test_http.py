"""HTTP(S) provider: conformance, and servers that misbehave."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.backends import HTTPBackend
from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom((2 << 20) + 4321)
#: Small parts so one read becomes several ranged GETs (not one streamed GET); quick retries.
SMALL = {"part_size": 256 << 10, "concurrency": 4, "backoff_initial": 0.01, "backoff_max": 0.05,
         "stream_reads": False}


def _put(server: HTTPTestServer, data: bytes = DATA) -> tuple[str, str]:
    key = f"obj-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, data)
    return key, server.url(key)


class TestHTTPConformance(ProviderConformance):
    @pytest.fixture(params=["http", "https"])
    def target(self, request: pytest.FixtureRequest, http_server: HTTPTestServer,
               https_server: HTTPTestServer) -> ConformanceTarget:
        server = http_server if request.param == "http" else https_server
        return ConformanceTarget(uri=server.url, put=server.put, options=server.options)


class TestHTTPFaultConformance(ProviderConformance):
    """The plugin's HTTP backend, with its faults (cuts, stalls, trickles, replacements)."""

    @pytest.fixture
    def target(self, tensorstream_http: HTTPBackend) -> ConformanceTarget:
        return ConformanceTarget.from_backend(tensorstream_http)


# -- well-behaved details -------------------------------------------------------
async def test_stat_reports_etag_and_mtime(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    info = await tensorstream.stat(url)
    assert (info.size, info.etag) == (len(DATA), http_server.etag(key))
    assert info.mtime is not None and abs(info.mtime.timestamp() - time.time()) < 60


async def test_stat_falls_back_to_ranged_get_when_head_is_refused(
        http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.status_script = [405]
    info = await tensorstream.stat(url)
    assert info.size == len(DATA) and info.etag == http_server.etag(key)
    log = [(r.method, r.status, r.headers.get("Range")) for r in http_server.requests]
    assert log == [("HEAD", 405, None), ("GET", 206, "bytes=0-0")]


async def test_empty_object(http_server: HTTPTestServer) -> None:
    _, url = _put(http_server, b"")
    assert (await tensorstream.stat(url)).size == 0
    with tensorstream.open(url) as f:
        assert f.read() == b""


def test_ranged_gets_ask_for_identity_and_pin_the_etag(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    with tensorstream.open(url, **SMALL) as f:
        assert f.read() == DATA
    gets = http_server.requests_for(key, "GET")
    assert len(gets) > 1
    for r in gets:
        assert r.headers["Accept-Encoding"] == "identity"
        assert r.headers["If-Match"] == http_server.etag(key)
        assert r.status == 206


# -- misbehaving servers -------------------------------------------------------------
async def test_server_ignoring_range_is_an_error_never_wrong_bytes(
        http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    http_server.faults.ignore_range = True
    with pytest.raises(errors.ProtocolError, match="ignored the Range"):
        await tensorstream.read_range(url, 1000, 2000)
    with tensorstream.open(url, **SMALL) as f, pytest.raises(errors.ProtocolError):
        f.seek(1000)
        f.read(300_000)


def _wait_for_gets(server: HTTPTestServer, key: str, n: int, timeout: float = 3.0) -> list[Any]:
    """The server's GET log for ``key`` once it holds ``n`` entries (it is written
    by the server thread, which may lag the client by a moment)."""
    import time

    deadline = time.monotonic() + timeout
    gets = server.requests_for(key, "GET")
    while len(gets) < n and time.monotonic() < deadline:
        time.sleep(0.02)
        gets = server.requests_for(key, "GET")
    return gets


def test_dropped_body_is_resumed_with_if_match(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.key = key  # only this object: a stray request must not take the cut
    http_server.faults.drop_after = 300_000
    http_server.faults.drop_times = 1
    # One request for the whole object (part_size > object): the cut lands in it.
    with tensorstream.open(url, retries=3, backoff_initial=0.01, concurrency=1,
                           part_size=8 << 20) as f:
        assert f.read() == DATA
        resumed = f._provider.metrics.resumed_bytes
    assert http_server.faults.dropped == 1
    assert resumed in (0, 300_000)
    if resumed:  # the cut reached this reader: the resumed GET starts exactly there, pinned
        gets = _wait_for_gets(http_server, key, 2)
        assert gets[0].headers["Range"] == f"bytes=0-{len(DATA) - 1}"
        assert gets[1].headers["Range"] == f"bytes=300000-{len(DATA) - 1}"
        assert gets[1].headers["If-Match"] == http_server.etag(key)


async def test_chunked_body_cut_without_content_length_is_detected(
        http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.no_content_length = True
    http_server.faults.drop_after = 100_000
    http_server.faults.drop_times = 1
    assert await tensorstream.read_range(url, 0, 1 << 20, concurrency=1) == DATA[: 1 << 20]
    gets = http_server.requests_for(key, "GET")
    assert gets[1].headers["Range"] == f"bytes=100000-{(1 << 20) - 1}"


async def test_body_cut_on_every_attempt_raises_never_short(
        http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.drop_after = 1000
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(url, 0, 100_000, retries=3, backoff_initial=0.01)
    assert isinstance(info.value.last_error, errors.IncompleteReadError)
    assert len(http_server.requests_for(key, "GET")) == 3


async def test_503_twice_then_success(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.status_script = [503, 503]
    http_server.faults.retry_after = 0.2
    t0 = time.monotonic()
    assert await tensorstream.read_range(url, 10, 5000) == DATA[10:5000]
    assert time.monotonic() - t0 >= 0.4  # Retry-After honoured twice
    assert [r.status for r in http_server.requests_for(key)] == [503, 503, 206]


async def test_429_forever_gives_up_after_the_attempt_limit(
        http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.status_script = [429] * 10
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(url, 0, 10, retries=3, backoff_initial=0.01)
    assert info.value.attempts == 3
    assert isinstance(info.value.last_error, errors.ServiceUnavailableError)
    assert len(http_server.requests_for(key)) == 3


def test_object_replaced_between_parts_raises(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    with tensorstream.open(url, **SMALL) as f:
        http_server.faults.replace_after_requests = 1
        with pytest.raises(errors.ObjectChangedError):
            f.read()
    assert any(r.status == 412 for r in http_server.requests_for(key, "GET"))


def test_replaced_object_detected_even_if_server_ignores_if_match(
        http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    with tensorstream.open(url, **SMALL) as f:
        http_server.faults.replace_after_requests = 1
        http_server.faults.ignore_if_match = True
        with pytest.raises(errors.ObjectChangedError):
            f.read()


@pytest.mark.parametrize("fault", ["gzip", "wrong_content_range"])
async def test_encoded_or_misplaced_ranges_are_refused(
        http_server: HTTPTestServer, fault: str) -> None:
    _, url = _put(http_server)
    setattr(http_server.faults, fault, True)
    with pytest.raises(errors.ProtocolError):
        await tensorstream.read_range(url, 100, 200_000)


@pytest.mark.parametrize(("status", "exc"), [
    (404, FileNotFoundError), (403, PermissionError), (401, PermissionError),
    (400, ValueError)])
async def test_client_errors_are_typed_and_not_retried(
        http_server: HTTPTestServer, status: int, exc: type[Exception]) -> None:
    key, url = _put(http_server)
    http_server.faults.status_script = [status]
    with pytest.raises(exc) as info:
        await tensorstream.read_range(url, 0, 10)
    assert isinstance(info.value, errors.TensorstreamError)
    assert not isinstance(info.value, errors.RetriesExhaustedError)
    assert len(http_server.requests_for(key)) == 1


async def test_idle_timeout_on_a_stalled_body(http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    http_server.faults.stall_after_headers = 3
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await tensorstream.read_range(url, 0, 1000, timeout_idle=0.3, retries=1)
    assert time.monotonic() - t0 < 2.5


async def test_connection_refused_is_a_connection_error() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.stat(f"http://127.0.0.1:{port}/x", retries=2, backoff_initial=0.01)
    assert isinstance(info.value.last_error, ConnectionError)
    # The error names where it tried (a port typo shows): it said "http stat /x: ...
    # connection failed (ConnectionRefusedError: ...)", no host, no port.
    assert f"cannot connect to 127.0.0.1:{port} (ConnectionRefusedError" in str(info.value)


async def test_an_unknown_host_is_named_in_the_error() -> None:
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.stat("http://no-such-host.invalid:8080/x", retries=2,
                                backoff_initial=0.01)
    assert isinstance(info.value.last_error, ConnectionError)
    assert "cannot connect to no-such-host.invalid:8080 (gaierror" in str(info.value)


@pytest.mark.parametrize("name", ["modèle v2.bin", "日本語/model.bin", "two  spaces.bin"])
async def test_a_path_with_spaces_or_beyond_ascii_is_sent_percent_encoded(
        http_server: HTTPTestServer, name: str) -> None:
    # http.client cannot send them: a space was a ProtocolError quoting the URL, a
    # character beyond ASCII a ConfigurationError blaming the credentials.
    key = f"{uuid.uuid4().hex[:8]}-{name}"
    http_server.put(key, DATA)
    query = "?X-Amz-Signature=sig%2Fx&b=%7E"  # around them, every byte kept
    url = http_server.url(key) + query
    assert (await tensorstream.stat(url)).size == len(DATA)
    assert await tensorstream.read_range(url, 5, 100) == DATA[5:100]
    with tensorstream.open(url) as f:
        assert f.read() == DATA
    assert all(r.path.endswith(query) for r in http_server.requests_for(key))


async def test_a_redirect_to_a_location_beyond_ascii_is_followed(
        http_server: HTTPTestServer) -> None:
    key = f"{uuid.uuid4().hex[:8]}.bin"
    http_server.put(f"modèles/{key}", DATA)
    with HTTPTestServer() as front:  # Location: <base>/modèles/<key>
        front.faults.redirect_to = f"{http_server.base_url}/modèles"
        got = await tensorstream.read_range(f"{front.base_url}/{key}", 0, 100)
    assert got == DATA[:100]


async def test_rate_limit_fault_slows_the_transfer(http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    http_server.faults.rate_limit = 1 << 20  # 1 MiB/s
    t0 = time.monotonic()
    assert await tensorstream.read_range(url, 0, 512 << 10) == DATA[: 512 << 10]
    assert time.monotonic() - t0 >= 0.4


def test_fault_key_limits_faults_to_one_object(http_server: HTTPTestServer) -> None:
    _, good = _put(http_server)
    bad_key, bad = _put(http_server)
    http_server.faults.key = bad_key
    http_server.faults.ignore_range = True
    with tensorstream.open(good, **SMALL) as f:
        assert f.read() == DATA
    with pytest.raises(errors.ProtocolError), tensorstream.open(bad, **SMALL) as f:
        f.read()
