"""The pytest plugin's fixtures and faults, against every mocked backend.

Each fault test reads through tensorstream's public API and checks both what
the client saw (bytes, errors, time) and what the server/proxy did.
"""

from __future__ import annotations

import os
import time

import pytest

import tensorstream
from tensorstream.errors import (
    ObjectChangedError,
    PermissionDeniedError,
    ProtocolError,
    RetriesExhaustedError,
    ServiceUnavailableError,
)
from tensorstream.testing.backends import UnsupportedFault

MiB = 1 << 20


def blob(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def read_all(backend, key: str, **extra) -> bytes:
    with tensorstream.open(backend.uri(key), **backend.options, **extra) as f:
        return f.read()


def timed_read(backend, key: str, **extra) -> tuple[bytes, float]:
    """Bytes and seconds spent reading them (client set-up excluded: S3 sessions are slow)."""
    with tensorstream.open(backend.uri(key), **backend.options, **extra) as f:
        t0 = time.monotonic()
        data = f.read()
        return data, time.monotonic() - t0


def ranges_requested(backend, key_suffix: str) -> list[str]:
    return [r.headers.get("Range", "") for r in backend.requests
            if r.method == "GET" and r.path.split("?")[0].endswith(key_suffix)]


# ---------------------------------------------------------------- fixtures
def test_backend_api_roundtrip(tensorstream_backend):
    b = tensorstream_backend
    data = blob(300_000)
    b.put("dir/model.bin", data)
    assert b.get("dir/model.bin") == data
    assert b.uri("dir/model.bin").startswith({"s3": "s3://", "http": "http://",
                                              "redis": "redis://"}[b.name])
    assert read_all(b, "dir/model.bin") == data
    assert b.kind in {"moto", "aiohttp", "redis-server", "fakeredis"}
    assert isinstance(b.options, dict) and b.options is not b.options  # a fresh copy each time


@pytest.mark.parametrize("key", ["dir/a b+c \u00fc.bin", "x%41y.bin", "q?v=1&w#frag.bin"],
                         ids=["space-plus-unicode", "percent", "query-fragment"])
def test_uri_of_any_key_reads_that_key(tensorstream_backend, key):
    # uri() used to paste the key in raw: an HTTP URL with a space was refused,
    # and %41 / ? / # were read as URL syntax (another key, a query, a fragment).
    b = tensorstream_backend
    b.put(key.replace("%41", "A").split("?")[0].split("#")[0], b"another object")
    b.put(key, b"the right object")
    assert read_all(b, key) == b"the right object"
    assert b.get(key) == b"the right object"


@pytest.mark.parametrize("key", ["new\nline.bin", "cr\rlf\n.bin"], ids=["newline", "cr-lf"])
def test_uri_of_a_key_with_a_line_break_reads_that_key(tensorstream_backend, key):
    # The HTTP server's route was "/{key:.*}": "." stops at a newline, so put/get
    # worked but the uri() of such a key was a 404 (S3 and Redis keys may hold one too).
    b = tensorstream_backend
    if b.name == "s3":
        pytest.skip("moto's own router answers 404 to a key with a line break")
    b.put(key, b"the right object")
    assert read_all(b, key) == b"the right object"


def test_each_test_gets_a_fresh_namespace(tensorstream_backend, request):
    # The same key in another test's namespace must not be visible here.
    b = tensorstream_backend
    with pytest.raises(KeyError):
        b.get("dir/model.bin")


def test_s3_environment_is_isolated(tensorstream_s3):
    for name in os.environ:
        assert not name.startswith("S3_"), name
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        assert name not in os.environ
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        with open(os.environ[name]) as f:
            assert f.read() == ""
    assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
    # The endpoint and keys travel only in the options.
    assert tensorstream_s3.options["s3_endpoint"].startswith("http://127.0.0.1:")


def test_s3_buckets_are_fresh_per_fixture(tensorstream_s3):
    assert tensorstream_s3.bucket.startswith("ts-test-")
    assert tensorstream_s3.server.client.list_objects_v2(
        Bucket=tensorstream_s3.bucket).get("KeyCount") == 0


@pytest.mark.tensorstream_http(tls=True, token=True)
def test_http_tls_and_token(tensorstream_http):
    b = tensorstream_http
    assert b.uri("x").startswith("https://")
    assert b.ca_bundle and os.path.exists(b.ca_bundle)
    assert b.options["ca_bundle"] == b.ca_bundle and b.options["token"] == b.token
    b.put("x", b"secret weights")
    assert read_all(b, "x") == b"secret weights"
    assert b.requests[-1].headers["Authorization"] == f"Bearer {b.token}"
    no_token = {k: v for k, v in b.options.items() if k != "token"}
    with pytest.raises(PermissionDeniedError):
        tensorstream.open(b.uri("x"), **no_token)


@pytest.mark.tensorstream_http(token=True)
def test_request_reprs_hide_the_token(tensorstream_http):
    # A failed assertion on backend.requests printed the bearer token to the CI log.
    b = tensorstream_http
    b.put("k", b"x")
    assert read_all(b, "k") == b"x"
    assert b.requests[-1].headers["Authorization"] == f"Bearer {b.token}"  # still checkable
    assert b.token not in repr(b.requests) and "Authorization': '***'" in repr(b.requests)
    assert b.token not in str(b.requests[-1])


@pytest.mark.parametrize("tensorstream_http", [{"token": "fixed-token"}], indirect=True)
def test_http_indirect_parametrisation(tensorstream_http):
    assert tensorstream_http.options == {"token": "fixed-token"}
    assert tensorstream_http.uri("k").startswith("http://")


def test_redis_kind_is_reported(tensorstream_redis):
    from tensorstream.testing.redis_server import redis_available

    assert tensorstream_redis.kind == ("redis-server" if redis_available() else "fakeredis")


@pytest.mark.tensorstream_real_redis
def test_real_redis_marker(tensorstream_redis):
    assert tensorstream_redis.kind == "redis-server"


def test_redis_rejects_http_only_faults_by_name(tensorstream_redis):
    f = tensorstream_redis.faults
    assert not f.supports("status_script") and not f.supports("ignore_range")
    assert f.supports("drop_after")
    with pytest.raises(UnsupportedFault, match="redis backend: status_script"):
        f.status_script([503])
    with pytest.raises(NotImplementedError, match="redis backend: ignore_range"):
        f.ignore_range()


# ------------------------------------------------------------------ faults
def test_latency_delays_every_request(tensorstream_backend):
    b = tensorstream_backend
    b.put("k", blob(10_000))
    b.faults.latency(0.4)
    data, took = timed_read(b, "k")
    assert data == blob(10_000)
    assert took >= 0.4


def test_rate_limit_slows_a_transfer_measurably(tensorstream_backend):
    b = tensorstream_backend
    data = blob(256 << 10)
    b.put("k", data)
    timed_read(b, "k")  # the first read pays the client's connection and imports
    _, base = timed_read(b, "k")
    b.faults.rate_limit(512 << 10)  # 256 KiB at 512 KiB/s: at least 0.5 s
    got, capped = timed_read(b, "k")
    assert got == data
    assert capped >= 0.45
    assert capped > 2 * base


def test_drop_after_is_resumed_exactly(tensorstream_backend):
    b = tensorstream_backend
    data = blob(MiB)
    b.put("k", data)
    b.faults.drop_after(200_000, times=1)
    assert read_all(b, "k") == data
    assert b.faults.dropped == 1
    if b.name != "redis":  # HTTP-level: the retry continued where the body broke
        ranges = ranges_requested(b, "/k")
        assert any(r.startswith("bytes=200000-") for r in ranges), ranges


def test_a_short_answer_does_not_use_up_a_drop(tensorstream_backend):
    # drop_after(n, times=1): the first body LONGER than n is cut. A small read
    # before it (a header) must neither spend the drop nor count as one.
    import asyncio

    b = tensorstream_backend
    data = blob(MiB)
    b.put("k", data)
    b.faults.drop_after(200_000, times=1)
    assert asyncio.run(tensorstream.read_range(b.uri("k"), 0, 10, **b.options)) == data[:10]
    assert b.faults.dropped == 0
    assert read_all(b, "k", stream_reads=False, readahead=0, part_size=MiB) == data
    assert b.faults.dropped == 1
    if b.name != "redis":
        ranges = ranges_requested(b, "/k")
        assert any(r.startswith("bytes=200000-") for r in ranges), ranges


def test_drop_times_one_cuts_one_of_concurrent_bodies(tensorstream_backend):
    # Four ranged reads at once (paced so their bodies overlap): times=1 is one cut,
    # not one per body in flight.
    import asyncio

    b = tensorstream_backend
    data = blob(4 * MiB)
    b.put("k", data)
    b.faults.drop_after(100_000, times=1).rate_limit(4 * MiB)

    async def read_quarters() -> list[bytes]:
        return await asyncio.gather(*(
            tensorstream.read_range(b.uri("k"), i * MiB, (i + 1) * MiB, **b.options)
            for i in range(4)))

    assert b"".join(asyncio.run(read_quarters())) == data
    assert b.faults.dropped == 1


def test_drop_on_every_response_is_an_error_never_short(tensorstream_backend):
    b = tensorstream_backend
    b.put("k", blob(MiB))
    b.faults.drop_after(1000)
    with pytest.raises(OSError):
        read_all(b, "k", retries=2, backoff_initial=0.01)
    assert b.faults.dropped >= 2


def test_status_script_is_retried_then_served(tensorstream_backend):
    b = tensorstream_backend
    b.put("k", blob(50_000))
    b.faults.status_script([503, 503, 200])
    assert read_all(b, "k", backoff_initial=0.01) == blob(50_000)
    assert b.faults.pending_statuses == []
    assert [r.status for r in b.requests[:3]] == [503, 503, b.requests[2].status]
    assert b.requests[2].status in (200, 206)


def test_a_2xx_in_the_status_script_serves_that_request(tensorstream_backend):
    # status_script([200, 503]) means "serve the first request, fail the second";
    # the 2xx entries were dropped from the script, so the first request got the 503.
    import urllib3

    b = tensorstream_backend
    b.put("k", b"served")
    url = f"{b.proxy.url}/{b.bucket}/k" if b.name == "s3" else b.uri("k")
    headers = {}
    if b.name == "s3":  # the proxy answers scripted statuses itself; moto wants a signature
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        signed = AWSRequest(method="GET", url=url)
        o = b.options
        S3SigV4Auth(Credentials(o["s3_access_key_id"], o["s3_secret_access_key"]), "s3",
                    o["s3_region"]).add_auth(signed)
        headers = dict(signed.headers.items())
    b.faults.status_script([200, 503, 200, 500])
    assert b.faults.pending_statuses == [200, 503, 200, 500]
    pool = urllib3.PoolManager()
    got = [pool.request("GET", url, headers=headers, retries=False) for _ in range(5)]
    assert [r.status for r in got] == [200, 503, 200, 500, 200]
    assert [r.data for r in got][::2] == [b"served"] * 3
    assert b.faults.pending_statuses == []


def test_status_script_is_observed_by_the_client(tensorstream_backend):
    b = tensorstream_backend
    b.put("k", blob(1000))
    b.faults.status_script([503, 503, 503])
    with pytest.raises((ServiceUnavailableError, RetriesExhaustedError)) as info:
        read_all(b, "k", retries=2, backoff_initial=0.01)
    assert "503" in str(info.value) or "SlowDown" in str(info.value) or isinstance(
        info.value, RetriesExhaustedError)
    assert b.faults.pending_statuses == [503]


@pytest.mark.parametrize(("seconds", "header"), [(0, "0"), (2, "2"), (2.0, "2"), (0.25, "0.25")])
def test_retry_after_is_sent_as_delta_seconds(tensorstream_backend, seconds, header):
    # status_script(retry_after=2) sent "Retry-After: 2.0", which is no HTTP
    # delta-seconds: urllib3 (requests) raised InvalidHeader instead of retrying.
    import urllib3

    b = tensorstream_backend
    b.put("k", b"served")
    url = f"{b.proxy.url}/{b.bucket}/k" if b.name == "s3" else b.uri("k")
    b.faults.status_script([503], retry_after=seconds)
    first = urllib3.PoolManager().request("GET", url, retries=False)
    assert (first.status, first.headers["Retry-After"]) == (503, header)
    if seconds == 0 and b.name == "http":  # an unmodified urllib3 client waits and retries
        b.faults.status_script([503], retry_after=seconds)
        retry = urllib3.Retry(1, status_forcelist=[503], respect_retry_after_header=True)
        assert urllib3.PoolManager().request("GET", url, retries=retry).data == b"served"


def test_ignore_range_is_caught(tensorstream_backend):
    b = tensorstream_backend
    b.put("k", blob(100_000))
    b.faults.ignore_range()

    async def read() -> bytes:
        return await tensorstream.read_range(b.uri("k"), 1000, 2000, **b.options)

    import asyncio

    with pytest.raises(ProtocolError):
        asyncio.run(read())


def test_s3_ignore_range_answers_with_the_requested_object(tensorstream_s3):
    # With signatures on, the proxy answers an ignored Range with the whole object
    # itself; for a key with '%' it used to decode the path twice and send another
    # object's bytes (x%41y.bin -> xAy.bin). A client that accepts a 200 took them.
    import boto3
    from botocore.config import Config

    b = tensorstream_s3
    b.put("x%41y.bin", b"R" * 1000)
    b.put("xAy.bin", b"W" * 1000)
    b.faults.ignore_range()
    o = b.options
    client = boto3.client("s3", endpoint_url=o["s3_endpoint"], region_name=o["s3_region"],
                          aws_access_key_id=o["s3_access_key_id"],
                          aws_secret_access_key=o["s3_secret_access_key"],
                          config=Config(s3={"addressing_style": "path"}))
    answer = client.get_object(Bucket=b.bucket, Key="x%41y.bin", Range="bytes=0-9")
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert answer["Body"].read() == b"R" * 1000


def test_replace_between_reads_raises_object_changed(tensorstream_backend):
    b = tensorstream_backend
    old, new = blob(MiB), blob(MiB, seed=1)
    b.put("k", old)
    b.faults.replace_between_reads("k", new)
    # No read-ahead, no streamed reads, small parts: the second read is a new
    # request (with read-ahead or a stream the old version may already be on
    # its way, which is never a mix).
    with tensorstream.open(b.uri("k"), **b.options, readahead=0, part_size=64 << 10,
                           stream_reads=False) as f:
        assert f.read(100) == old[:100]  # first read: the old object
        f.seek(512 << 10)
        with pytest.raises(ObjectChangedError):
            f.read(100)
    assert b.get("k") == new
    assert read_all(b, "k") == new  # a fresh open sees the new version


@pytest.mark.parametrize("other", ["k:v2", "k:"])
def test_replace_between_reads_counts_reads_of_its_key_only(tensorstream_backend, other):
    # On Redis, reads of "k:v2" (whose chunk keys start with k's "<prefix>/k:")
    # counted as reads of "k": "k" was replaced before anyone had read it.
    b = tensorstream_backend
    b.put("k", b"old" * 1000)
    b.put(other, b"other" * 1000)
    b.faults.replace_between_reads("k", b"new" * 1000)
    for _ in range(3):
        assert read_all(b, other) == b"other" * 1000
    assert b.get("k") == b"old" * 1000
    assert read_all(b, "k") == b"old" * 1000


@pytest.mark.parametrize("bad", [
    lambda f: f.latency(-1),
    lambda f: f.latency(float("nan")),
    lambda f: f.latency(float("inf")),  # used to hang every request
    lambda f: f.latency("soon"),
    lambda f: f.rate_limit(0.5),  # truncated to 0: no cap at all
    lambda f: f.rate_limit(0),
    lambda f: f.drop_after(-5),
    lambda f: f.drop_after(10, times=0),
    lambda f: f.drop_after(10, times=-1),
    lambda f: f.status_script([99]),
    lambda f: f.status_script([1000]),
    lambda f: f.status_script(["503"]),
    lambda f: f.status_script(503),
    lambda f: f.status_script([503], retry_after=-1),
], ids=["neg-latency", "nan-latency", "inf-latency", "str-latency", "fraction-rate", "zero-rate",
        "neg-drop", "zero-times", "neg-times", "status-99", "status-1000", "str-status",
        "not-a-list", "neg-retry-after"])
def test_a_bad_fault_value_is_refused_by_name(tensorstream_http, bad):
    from tensorstream.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"faults\.(latency|rate_limit|drop_after|status_script)"):
        bad(tensorstream_http.faults)
    raw = tensorstream_http.faults.raw  # nothing was half-applied
    assert (raw.latency, raw.rate_limit, raw.drop_after, raw.status_script) == (0.0, None, None, [])


def test_faults_chain_and_reset(tensorstream_backend):
    b = tensorstream_backend
    f = b.faults.latency(5).drop_after(1)
    assert f is b.faults
    b.faults.reset()
    b.put("k", b"fine")
    data, took = timed_read(b, "k")
    assert data == b"fine" and took < 5


def test_a_fault_set_as_an_attribute_is_refused(tensorstream_backend):
    # ``faults.latency = 0.5`` used to shadow the method and inject nothing; a
    # backend-specific setting (``faults.gzip``) belongs on ``faults.raw``.
    f = tensorstream_backend.faults
    with pytest.raises(AttributeError, match=r"faults\.latency is a method: call faults\.latency\("):
        f.latency = 0.5
    with pytest.raises(AttributeError, match=r"faults\.drop_times is not a fault"):
        f.drop_times = 1
    assert callable(f.latency)
    f.on_unsupported = f.on_unsupported  # the plugin's own hook stays settable


@pytest.mark.parametrize("fixture, name, hint", [
    ("tensorstream_http", "wrong_content_rnage", r"did you mean wrong_content_range"),
    ("tensorstream_s3", "use_rst", r"use_rst is a fault of tensorstream_redis \(TCPFaults\)"),
    ("tensorstream_redis", "gzip", r"gzip is a fault of tensorstream_http \(HTTPFaults\)"),
    ("tensorstream_redis", "status_script", r"status_script is a fault of tensorstream_http"),
])
def test_a_misspelt_or_foreign_raw_fault_is_refused(request, fixture, name, hint):
    # A raw setting that does not exist (misspelt, or another backend's) was stored
    # as a new attribute and silently injected nothing: the test passed untested.
    raw = request.getfixturevalue(fixture).faults.raw
    with pytest.raises(AttributeError, match=hint):
        setattr(raw, name, True)
    assert not hasattr(raw, name)


def test_a_misspelt_fault_name_is_named_with_the_closest_one(tensorstream_backend):
    # pytest printed only "'_S3ProxyFaults' object has no attribute 'lantency'",
    # an internal class name and no hint (Python's own suggestion is not in str()).
    with pytest.raises(AttributeError, match=r"faults\.lantency: no such fault; did you mean latency\?"):
        tensorstream_backend.faults.lantency(1)
    with pytest.raises(AttributeError, match=r"has no setting 'gzp'"):
        tensorstream_backend.faults.raw.gzp  # noqa: B018
