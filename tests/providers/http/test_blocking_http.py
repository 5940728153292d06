"""The blocking HTTP(S) data path (``HTTPProvider.readinto_blocking`` on
http.client): exact bytes from many threads, the same checks and errors as
the async path, connection reuse only after a clean body, TLS, redirects."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import tensorstream
from fixtures_http import HTTP_TEST_TOKEN
from reliability_helpers import RawHTTPServer, raw_object_responder
from tensorstream import errors
from tensorstream.config import Timeouts, split_options
from tensorstream.providers._http.range_get import ConnectionPool, open_range
from tensorstream.providers.base import Pin
from tensorstream.providers.http.provider import HTTPProvider
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.uri import parse_uri

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom((3 << 20) + 777)


def _put(server: HTTPTestServer, data: bytes = DATA) -> tuple[str, str]:
    key = f"blk-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, data)
    return key, server.url(key)


def _provider(url: str, **options: Any) -> HTTPProvider:
    common, own = split_options(options)
    return HTTPProvider.from_uri(parse_uri(url), config=common, **own)


def _read(p: HTTPProvider, url: str, offset: int, size: int, etag: str | None = None) -> bytes:
    buf = bytearray(size)
    assert p.readinto_blocking(parse_uri(url).path, offset, memoryview(buf),
                               pin=Pin(etag=etag) if etag else None) == size
    return bytes(buf)


def test_capability_is_declared() -> None:
    assert HTTPProvider.capabilities.blocking_reads


# -- correctness under concurrency ----------------------------------------------------------
def test_many_random_ranges_from_many_threads(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    p = _provider(url)
    rng = random.Random(7)
    ranges = [(o, rng.randint(1, 600_000)) for o in
              (rng.randrange(len(DATA) - 600_000) for _ in range(120))]
    ranges += [(0, len(DATA)), (len(DATA) - 1, 1), (12345, 1)]
    buffers = {i: bytearray(n) for i, (_, n) in enumerate(ranges)}

    def one(i: int) -> None:
        off, _n = ranges[i]
        p.readinto_blocking(parse_uri(url).path, off, memoryview(buffers[i]),
                            pin=Pin(etag=http_server.etag(key)))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(len(ranges))))
    for i, (off, n) in enumerate(ranges):
        assert bytes(buffers[i]) == DATA[off : off + n], i
    pool_ = p._blocking_pool()
    assert pool_.created <= 8 + 2  # keep-alive: connections are reused, not one per read
    gets = http_server.requests_for(key, "GET")
    assert len(gets) == len(ranges) and all(r.status == 206 for r in gets)
    assert all(r.headers.get("Accept-Encoding") == "identity" for r in gets)
    assert all(r.headers.get("If-Match") == http_server.etag(key) for r in gets)


def test_chunked_body_without_content_length(http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    http_server.faults.no_content_length = True
    p = _provider(url)
    assert _read(p, url, 1000, 300_000) == DATA[1000:301_000]
    assert _read(p, url, 5, 5) == DATA[5:10]


# -- refusing wrong answers -----------------------------------------------------------------
@pytest.mark.parametrize("fault", ["ignore_range", "gzip", "wrong_content_range"])
def test_wrong_answers_are_protocol_errors(http_server: HTTPTestServer, fault: str) -> None:
    _, url = _put(http_server)
    setattr(http_server.faults, fault, True)
    buf = bytearray(b"\xaa" * 100)
    with pytest.raises(errors.ProtocolError):
        _provider(url).readinto_blocking(parse_uri(url).path, 10, memoryview(buf))


def test_ranges_past_the_end(http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    p = _provider(url)
    with pytest.raises(errors.InvalidRangeError):  # 416
        _read(p, url, len(DATA) + 10, 5)
    with pytest.raises(errors.InvalidRangeError):  # clamped 206
        _read(p, url, len(DATA) - 5, 10)
    with pytest.raises(errors.InvalidRangeError):
        _read(p, url, -1, 5)
    assert p.readinto_blocking(parse_uri(url).path, 0, memoryview(bytearray(0))) == 0


def test_pinned_reads(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    p = _provider(url)
    etag = http_server.etag(key)
    assert _read(p, url, 0, 100, etag) == DATA[:100]
    with pytest.raises(errors.ObjectChangedError):  # 412 from If-Match
        _read(p, url, 0, 100, '"not-the-etag"')
    http_server.faults.ignore_if_match = True  # the server ignores If-Match: ETag compared
    with pytest.raises(errors.ObjectChangedError):
        _read(p, url, 0, 100, '"not-the-etag"')


@pytest.mark.parametrize(("status", "exc"), [
    (404, errors.NotFoundError), (403, errors.PermissionDeniedError),
    (503, errors.ServiceUnavailableError), (400, errors.ConfigurationError)])
def test_statuses_map_like_the_async_path(http_server: HTTPTestServer, status: int,
                                          exc: type[Exception]) -> None:
    _, url = _put(http_server)
    http_server.faults.status_script = [status]
    http_server.faults.retry_after = 2
    with pytest.raises(exc) as info:
        _read(_provider(url), url, 0, 10)
    if status == 503:
        assert info.value.retry_after == 2  # type: ignore[attr-defined]
    assert info.value.temporary == (status == 503)  # type: ignore[attr-defined]


# -- broken bodies and connection reuse ------------------------------------------------------
def test_cut_body_reports_received_and_is_not_reused(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    p = _provider(url)
    assert _read(p, url, 0, 10) == DATA[:10]  # one idle connection in the pool
    assert p._blocking_pool().idle_count() == 1
    http_server.faults.drop_after = 1_500_000
    http_server.faults.drop_times = 1
    buf = bytearray(2_000_000)
    with pytest.raises(errors.IncompleteReadError) as info:
        p.readinto_blocking(parse_uri(url).path, 1000, memoryview(buf))
    got = info.value.received
    assert got == 1_500_000  # exact: every received byte counts
    assert bytes(buf[:got]) == DATA[1000 : 1000 + got]  # the received bytes are valid
    assert info.value.served.etag == http_server.etag(key)  # the version they came from
    assert p._blocking_pool().idle_count() == 0  # the cut connection was discarded
    # Resume exactly as the policy layer does: a fresh connection, right bytes.
    p.readinto_blocking(parse_uri(url).path, 1000 + got, memoryview(buf)[got:])
    assert bytes(buf) == DATA[1000:2_001_000]


def test_idle_timeout_is_a_storage_timeout_and_connection_is_dropped(
        http_server: HTTPTestServer) -> None:
    _, url = _put(http_server)
    p = _provider(url, timeout_idle=0.3)
    http_server.faults.stall_after_headers = 2.0
    http_server.faults.stall_times = 1
    with pytest.raises(errors.StorageTimeoutError) as info:
        _read(p, url, 0, 1000)
    assert info.value.received == 0 and info.value.temporary
    assert p._blocking_pool().idle_count() == 0
    assert _read(p, url, 0, 1000) == DATA[:1000]


def test_interrupted_read_never_leaks_bytes_into_the_next(http_server: HTTPTestServer) -> None:
    """A caller that gives up mid-body (any exception) must not leave the rest of
    that body on a pooled connection."""
    _, url = _put(http_server)
    pool = ConnectionPool()
    t = Timeouts(connect=5, idle=5)

    class Stop(Exception):
        pass

    buf = memoryview(bytearray(3 << 20))
    calls = {"n": 0}
    real = pool.acquire

    def acquire(key: Any, timeouts: Timeouts, **kwargs: Any) -> Any:
        conn, reused = real(key, timeouts, **kwargs)
        orig = conn.getresponse

        def getresponse() -> Any:
            resp = orig()
            fp = resp.fp

            class Breaking:  # the body reader, failing on its second call
                def readinto1(self, b: Any) -> int:
                    calls["n"] += 1
                    if calls["n"] == 2:
                        raise Stop
                    return int(fp.readinto1(b))

                def __getattr__(self, name: str) -> Any:
                    return getattr(fp, name)

            resp.fp = Breaking()  # type: ignore[assignment]
            return resp

        conn.getresponse = getresponse  # type: ignore[method-assign]
        return conn, reused

    pool.acquire = acquire  # type: ignore[method-assign]
    with pytest.raises(Stop):
        open_range(pool, url, 0, len(buf), {}, None, t).readinto(buf)
    assert pool.idle_count() == 0
    pool.acquire = real  # type: ignore[method-assign]
    small = bytearray(100)
    open_range(pool, url, 50, 150, {}, None, t).readinto(memoryview(small))
    assert bytes(small) == DATA[50:150]


# -- auth, TLS, redirects, secrets ------------------------------------------------------------
def test_token_is_sent_and_wrong_token_never_shown(http_token_server: HTTPTestServer) -> None:
    key, url = _put(http_token_server)
    assert _read(_provider(url, token=HTTP_TEST_TOKEN), url, 3, 30) == DATA[3:33]
    assert http_token_server.requests_for(key)[-1].headers["Authorization"] == (
        f"Bearer {HTTP_TEST_TOKEN}")
    with pytest.raises(errors.PermissionDeniedError) as info:
        _read(_provider(url, token="nope-canary"), url, 0, 10)
    assert "nope-canary" not in f"{info.value} {info.value!r}"


def test_tls_untrusted_refused_ca_bundle_and_insecure_work(https_server: HTTPTestServer) -> None:
    _, url = _put(https_server)
    with pytest.raises(errors.ConnectionFailedError, match=r"(?i)certificate") as info:
        _read(_provider(url), url, 0, 10)
    assert not info.value.temporary
    assert _read(_provider(url, ca_bundle=https_server.ca_bundle_path), url, 7, 70_000) == (
        DATA[7:70_007])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.InsecureTLSWarning)
        assert _read(_provider(url, insecure=True), url, 0, 10) == DATA[:10]


def test_redirect_to_another_origin_drops_credentials(
        http_server: HTTPTestServer, https_server: HTTPTestServer) -> None:
    key, _ = _put(https_server)
    http_server.faults.redirect_to = https_server.base_url
    url = http_server.url(key)
    p = _provider(url, token=HTTP_TEST_TOKEN, headers={"X-Api-Key": "hdr-canary"},
                  ca_bundle=https_server.ca_bundle_path)
    assert _read(p, url, 0, 1000) == DATA[:1000]
    first = http_server.requests_for(key)[0]
    assert first.status == 307 and first.headers["Authorization"] == f"Bearer {HTTP_TEST_TOKEN}"
    landed = https_server.requests_for(key)
    assert landed and all("Authorization" not in r.headers and "X-Api-Key" not in r.headers
                          for r in landed)


def test_redirects_refuse_metadata_and_loops(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.redirect_to = "http://169.254.169.254"
    with pytest.raises(errors.PermissionDeniedError, match="link-local"):
        _read(_provider(url), url, 0, 10)
    http_server.faults.redirect_to = http_server.base_url  # to itself, forever
    http_server.clear_log()
    with pytest.raises(errors.ProtocolError, match="redirects"):
        _read(_provider(url), url, 0, 10)
    assert len(http_server.requests_for(key)) == 6


def test_presigned_secret_is_sent_verbatim_and_never_shown(
        http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    key, url = _put(http_server)
    query = "?X-Amz-Signature=sig%2Fcanary&X-Amz-Credential=AKIA%2Fcanary&a=1"
    caplog.set_level(logging.DEBUG)
    p = _provider(url)
    assert _read(p, url + query, 0, 10) == DATA[:10]
    assert http_server.requests_for(key)[-1].path.endswith(query)  # not re-encoded
    for fault in ({"status_script": [404]}, {"drop_after": 10, "drop_times": 1}):
        for name, value in fault.items():
            setattr(http_server.faults, name, value)
        with pytest.raises(errors.TensorstreamError) as info:
            _read(p, url + query, 0, 1000)
        text = f"{info.value} {info.value!r} {info.value.path}"
        assert "canary" not in text and "X-Amz-Signature=***" in text
    assert "canary" not in caplog.text


def test_threads_really_overlap(http_server: HTTPTestServer) -> None:
    """Several reads are in flight at once (the GIL is released while receiving)."""
    _, url = _put(http_server)
    http_server.faults.rate_limit = 4 << 20  # 4 MiB/s per response: ~0.25 s per MiB
    p = _provider(url)
    active, peak, lock = [0], [0], threading.Lock()

    def one(i: int) -> bytes:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return _read(p, url, i << 20, 1 << 20)
        finally:
            with lock:
                active[0] -= 1

    t0 = time.monotonic()
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(one, range(3)))
    elapsed = time.monotonic() - t0
    assert got == [DATA[i << 20 : (i + 1) << 20] for i in range(3)]
    assert peak[0] == 3 and elapsed < 0.6  # serial would take ~0.75 s



# -- a slow link is not a stall -------------------------------------------------------------
@pytest.mark.parametrize("door", ["open-streamed", "open-ranged", "read_range"])
@pytest.mark.parametrize("backend", ["http", "https", "s3"])
def test_a_steady_slow_body_is_not_an_idle_timeout(request: pytest.FixtureRequest, backend: str,
                                                   door: str) -> None:
    """``timeout_idle`` is time without a byte: a body arriving steadily (15 kB every
    50 ms) but slower than the receive's low-water mark (256 KiB) fills in that time
    reads whole (HTTP and S3 share the data plane). It was cut at every
    ``timeout_idle`` as a stall ("timed out after 0 bytes"), and a read of 1 GiB at
    8 kB/s failed under the default 30 s."""
    if backend == "https":  # (a TLS body is read from its TLS object once it is large)
        store = request.getfixturevalue("tensorstream_servers").http(tls=True)
        request.addfinalizer(store.faults.reset)
    else:
        store = request.getfixturevalue(f"tensorstream_{backend}")
    data = os.urandom(600_000)
    key = f"slow-{uuid.uuid4().hex[:10]}.bin"
    store.put(key, data)
    store.faults.rate_limit(300_000)
    uri = store.uri(key)
    options: dict[str, Any] = {**store.options, "timeout_idle": 0.3, "retries": 1}
    if door == "read_range":
        got = asyncio.run(tensorstream.read_range(uri, 0, len(data), **options))
    else:
        with tensorstream.open(uri, stream_reads=door == "open-streamed", **options) as f:
            got = f.read()
    assert got == data


@pytest.mark.parametrize("door", ["open-streamed", "open-ranged", "read_range"])
def test_a_body_that_stops_below_the_low_water_mark_is_a_stall_resumed_where_it_stopped(
        door: str) -> None:
    """The neighbour: a body that comes in small pieces and stops for good 100 kB in
    (below the 256 KiB mark) is still a stall within about ``timeout_idle``, and the
    bytes that came count: the retry asks from byte 100,000 on (it asked from 0 again,
    each time, and the read failed)."""
    data = os.urandom(600_000)
    whole = raw_object_responder(data)

    def respond(method: str, headers: dict[str, str], attempt: int) -> Any:
        answer = whole(method, headers, attempt)
        if method == "GET":  # with its length: a body that can be resumed exactly,
            head, _, body = answer.partition(b"\r\n\r\n")
            # (and kept alive, as far as the client knows: its socket stays its own)
            head = head.replace(b"\r\nConnection: close", b"")
            head += f"\r\nContent-Length: {len(body)}".encode()
            if headers.get("range", "").startswith("bytes=0-"):
                pieces: list[Any] = [head + b"\r\n\r\n"]
                for at in range(0, 100_000, 10_000):  # 100 kB in 0.2 s, then silence
                    pieces += [body[at:at + 10_000], 0.02]
                return [*pieces, 5.0]
            return head + b"\r\n\r\n" + body
        return answer

    options: dict[str, Any] = {"timeout_idle": 0.3, "retries": 2, "backoff_initial": 0.01}
    with RawHTTPServer(respond) as server:
        started = time.monotonic()
        if door == "read_range":
            got = asyncio.run(tensorstream.read_range(server.url("o"), 0, len(data), **options))
        else:
            with tensorstream.open(server.url("o"), stream_reads=door == "open-streamed",
                                   **options) as f:
                got = f.read()
        elapsed = time.monotonic() - started
    assert got == data
    assert elapsed < 2.5
    ranges = [h.get("range") for m, h in server.requests if m == "GET"]
    assert ranges[-1] == f"bytes=100000-{len(data) - 1}", ranges
