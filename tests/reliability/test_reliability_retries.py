"""Reliability: retries and typed errors (issue 9, cases 1-4)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from reliability_helpers import (
    CANARY_ARG,
    FAST,
    CompleteErrorProxy,
    OnRetryLog,
    PartErrorProxy,
    free_port,
    leaked,
    put_http,
    unique,
)
from tensorstream import errors
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.proxy import HTTPFaultProxy, TCPFaultProxy
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(60)]

DATA = os.urandom(300_000)


# -- 1. refused twice, then up --------------------------------------------------
def test_connection_refused_twice_then_up_succeeds_and_logs_attempts(
        http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    key, _ = put_http(http_server, DATA)
    port = free_port()  # nothing listens here yet: connect() is refused
    proxy = TCPFaultProxy("127.0.0.1", http_server.port, listen_port=port)

    def come_up(failures: int) -> None:
        if failures == 2:
            proxy.start()  # the third attempt finds a listener

    caplog.set_level(logging.DEBUG, logger="tensorstream")
    try:
        with OnRetryLog(come_up) as hook:
            with tensorstream.open(f"http://127.0.0.1:{port}/{key}", retries=5,
                                   backoff_initial=0.05, backoff_max=0.2) as f:
                assert f.read() == DATA
    finally:
        proxy.stop()
    assert len(hook.records) == 2
    lines = [r.getMessage() for r in hook.records]
    assert "attempt 1 failed (ConnectionFailedError" in lines[0]
    assert "attempt 2 failed (ConnectionFailedError" in lines[1]
    assert all("retrying in" in line for line in lines)
    assert proxy.faults.connections >= 1


# -- 2. 503 SlowDown repeatedly ---------------------------------------------------
async def test_503_forever_honours_retry_after_then_names_operation_and_attempts(
        http_token_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    key, url = put_http(http_token_server, DATA)
    http_token_server.faults.status_script = [503] * 10
    http_token_server.faults.retry_after = 0.3
    caplog.set_level(logging.DEBUG)
    t0 = time.monotonic()
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(url + "?token=" + CANARY_ARG, 0, 100, retries=3,
                                      backoff_initial=0.001, backoff_max=5,
                                      token=CANARY_ARG)
    elapsed = time.monotonic() - t0
    assert elapsed >= 2 * 0.3 * 0.95, "Retry-After (0.3 s) was not honoured between attempts"
    exc = info.value
    assert exc.attempts == 3 and isinstance(exc.last_error, errors.ServiceUnavailableError)
    assert isinstance(exc, OSError) and not exc.temporary
    text = str(exc)
    assert "read" in text and "3 attempts" in text and "503" in text
    assert exc.operation == "read" and exc.service == "http"
    assert len(http_token_server.requests_for(key)) == 3
    assert "retrying in 0.30s" in caplog.text
    assert not leaked(f"{exc} {exc!r} {exc.last_error!r} {caplog.text}", (CANARY_ARG,))


async def test_backoff_without_retry_after_is_jittered_and_bounded(
        http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    sleeps: list[float] = []

    def grab(_n: int) -> None:
        args: Any = hook.records[-1].args
        sleeps.append(float(args[-1]))

    http_server.faults.status_script = [503] * 6
    with OnRetryLog(grab) as hook:
        with pytest.raises(errors.RetriesExhaustedError):
            await tensorstream.stat(url, retries=6, backoff_initial=0.02, backoff_max=0.08)
    assert len(sleeps) == 5
    assert all(0 <= s <= 0.08 for s in sleeps)
    assert len(set(sleeps)) > 1, f"backoff is not jittered: {sleeps}"


# -- 3. 403/404/400: typed, builtin subclasses, never retried -----------------------
@pytest.mark.parametrize(("status", "cls", "builtin"), [
    (403, errors.PermissionDeniedError, PermissionError),
    (401, errors.PermissionDeniedError, PermissionError),
    (404, errors.NotFoundError, FileNotFoundError),
    (400, errors.ConfigurationError, ValueError),
])
async def test_http_client_errors_are_typed_and_not_retried(
        http_server: HTTPTestServer, status: int, cls: type, builtin: type) -> None:
    key, url = put_http(http_server, DATA)
    http_server.faults.status_script = [status] * 5
    with pytest.raises(cls) as info:
        await tensorstream.read_range(url, 0, 10, retries=5, **FAST)
    assert isinstance(info.value, builtin)
    assert not isinstance(info.value, errors.RetriesExhaustedError)
    # HEAD 400/403 fall back to one GET probe (presigned GET-only URLs); never more.
    assert len(http_server.requests_for(key)) <= 2
    assert str(status) in str(info.value)


@pytest.mark.parametrize(("status", "cls", "builtin"), [
    (403, errors.PermissionDeniedError, PermissionError),
    (404, errors.NotFoundError, FileNotFoundError),
    (400, errors.ConfigurationError, ValueError),
])
async def test_s3_client_errors_are_typed_and_not_retried(
        moto_s3_public: MotoS3Server, status: int, cls: type, builtin: type) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        proxy.faults.status_script = [status] * 5
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        with pytest.raises(cls) as info:
            await tensorstream.read_range(f"s3://{S3_BUCKET}/{key}", 0, 10, retries=5,
                                          **FAST, **opts)
        assert isinstance(info.value, builtin)
        assert proxy.faults.scripted == 1, "a 4xx answer was retried"


async def test_s3_slowdown_is_retried_then_served(moto_s3_public: MotoS3Server) -> None:
    key = unique()
    moto_s3_public.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3_public.endpoint_url) as proxy:
        proxy.faults.status_script = [503, 503]
        opts = moto_s3_public.options(s3_endpoint=proxy.url)
        got = await tensorstream.read_range(f"s3://{S3_BUCKET}/{key}", 5, 5000, **FAST, **opts)
    assert got == DATA[5:5000] and proxy.faults.scripted == 2


def test_fault_proxy_keeps_sigv4_requests_valid(moto_s3: MotoS3Server) -> None:
    """The HTTP fault proxy must be transparent to signed requests: a real S3 checks
    the Host header the client signed (tensorstream.testing.proxy)."""
    key = unique()
    moto_s3.put(S3_BUCKET, key, DATA)
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        opts = moto_s3.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", **FAST, **opts) as f:
            assert f.read() == DATA


# -- 4. 200 + <Error> on CompleteMultipartUpload --------------------------------------
def test_s3_complete_answered_200_with_error_document_is_a_failure(
        moto_s3_public: MotoS3Server) -> None:
    moto_s3 = moto_s3_public
    key = unique()
    blob = os.urandom((5 << 20) * 2 + 1000)  # two 5 MiB parts + a tail: multipart
    proxy = CompleteErrorProxy(moto_s3.endpoint_url)
    with proxy:
        opts = moto_s3.options(s3_endpoint=proxy.url)
        f = tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", part_size=5 << 20, **FAST, **opts)
        f.write(blob)
        with pytest.raises(errors.TensorstreamError) as info:
            f.close()
        assert proxy.completes >= 1
    assert "commit" in str(info.value) or "complete" in str(info.value).lower()
    assert not moto_s3.exists(S3_BUCKET, key)
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("how", ["open", "cp"])
def test_s3_upload_parts_are_sent_again_after_a_temporary_error(
        moto_s3_public: MotoS3Server, tmp_path: Any, how: str) -> None:
    # A part is idempotent: a 500 (S3's "InternalError, please try again") on two of
    # them is retried under the policy, and the object is whole. Before, one failed
    # part failed the whole upload.
    moto_s3 = moto_s3_public
    key = unique()
    blob = os.urandom((5 << 20) * 3 + 1000)  # three 5 MiB parts + a tail: multipart
    with PartErrorProxy(moto_s3.endpoint_url, fail=2) as proxy:
        opts = moto_s3.options(s3_endpoint=proxy.url)
        if how == "open":
            with tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", part_size=5 << 20, **FAST,
                                   **opts) as f:
                f.write(blob)
        else:
            src = tmp_path / "blob.bin"
            src.write_bytes(blob)
            from tensorstream.copy import copy

            copy(str(src), f"s3://{S3_BUCKET}/{key}", part_size=5 << 20, **FAST, **opts)
        assert proxy.failed == 2 and proxy.parts >= 6
    assert moto_s3.get(S3_BUCKET, key) == blob


def test_s3_upload_parts_that_keep_failing_fail_the_write_and_abort_it(
        moto_s3_public: MotoS3Server) -> None:
    moto_s3 = moto_s3_public
    key = unique()
    blob = os.urandom((5 << 20) * 2 + 1000)
    with PartErrorProxy(moto_s3.endpoint_url, fail=None, status=503) as proxy:
        opts = moto_s3.options(s3_endpoint=proxy.url)
        f = tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", part_size=5 << 20, retries=3,
                              **FAST, **opts)
        f.write(blob)
        with pytest.raises(errors.TensorstreamError):
            f.close()
        assert proxy.failed >= 3  # each part's attempts, then given up
    assert not moto_s3.exists(S3_BUCKET, key)
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


def test_s3_upload_parts_are_not_retried_on_a_permanent_error(
        moto_s3_public: MotoS3Server) -> None:
    moto_s3 = moto_s3_public
    key = unique()
    with PartErrorProxy(moto_s3.endpoint_url, fail=None, status=403) as proxy:
        opts = moto_s3.options(s3_endpoint=proxy.url)
        f = tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", part_size=5 << 20, **FAST,
                              **opts)
        f.write(os.urandom((5 << 20) + 10))
        with pytest.raises(errors.TensorstreamError):
            f.close()
        assert proxy.failed == proxy.parts >= 1  # each part sent once: a refusal is final
    assert not moto_s3.exists(S3_BUCKET, key)
