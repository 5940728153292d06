"""``S3Provider.open_whole_blocking``: one signed GET (``Range: bytes=0-``)
stands in for the ``HEAD`` before a load (same size, ETag and version) and its
body is the stream from byte 0; later reads pinned to it refuse a replaced
object; anything else falls back to the ``HEAD`` (moto, SigV4 checked)."""

from __future__ import annotations

import os
import uuid

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET, s3_provider
from tensorstream.errors import ObjectChangedError
from tensorstream.providers.base import Pin
from tensorstream.testing.proxy import HTTPFaultProxy
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

DATA = os.urandom((2 << 20) + 77)


def _put(server: MotoS3Server, data: bytes = DATA) -> str:
    key = f"whole/{uuid.uuid4().hex[:10]}.bin"
    server.put(S3_BUCKET, key, data)
    return f"{S3_BUCKET}/{key}"


def test_one_get_stands_in_for_the_head(moto_s3: MotoS3Server) -> None:
    path = _put(moto_s3)
    p = s3_provider(moto_s3)
    head = p.stat_blocking(path)
    got = p.open_whole_blocking(path)
    assert got is not None
    info, body = got
    assert (info.size, info.etag, info.version) == (head.size, head.etag, head.version)
    assert info.extra == head.extra
    buf = bytearray(len(DATA))
    body.readinto(memoryview(buf))
    assert bytes(buf) == DATA


def test_reads_pinned_to_it_refuse_a_replaced_object(moto_s3: MotoS3Server) -> None:
    path = _put(moto_s3)
    p = s3_provider(moto_s3)
    got = p.open_whole_blocking(path)
    assert got is not None
    info, body = got
    body.close()
    moto_s3.put(S3_BUCKET, path.split("/", 1)[1], bytes(b ^ 0xFF for b in DATA))
    with pytest.raises(ObjectChangedError):
        p.readinto_blocking(path, 1 << 20, memoryview(bytearray(4096)), pin=Pin.of(info))


def test_missing_and_empty_objects_fall_back_to_the_head(moto_s3: MotoS3Server) -> None:
    p = s3_provider(moto_s3)
    assert p.open_whole_blocking(f"{S3_BUCKET}/whole/absent-{uuid.uuid4().hex}") is None
    assert p.open_whole_blocking(_put(moto_s3, b"")) is None


@pytest.mark.parametrize("sequential", [True, False])
def test_open_reads_every_byte(moto_s3: MotoS3Server, sequential: bool) -> None:
    path = _put(moto_s3)
    with tensorstream.open(f"s3://{path}", sequential=sequential, **moto_s3.options()) as f:
        assert f.size == len(DATA)
        assert f.read() == DATA


def test_a_cut_first_body_is_resumed_exactly_and_pinned(moto_s3: MotoS3Server) -> None:
    path = _put(moto_s3)
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        proxy.faults.drop_after, proxy.faults.drop_times = 300_000, 1
        opts = moto_s3.options(s3_endpoint=proxy.url)
        with tensorstream.open(f"s3://{path}", sequential=True, **opts) as f:
            assert f.read() == DATA
            etag = f.etag
        gets = [r for r in proxy.requests if r.method == "GET"]
    assert proxy.faults.dropped == 1 and len(gets) == 2
    assert gets[0].headers["Range"] == "bytes=0-"
    assert gets[1].headers["Range"] == f"bytes=300000-{len(DATA) - 1}"
    assert gets[1].headers["If-Match"] == etag  # pinned to what open's GET reported
    assert not [r for r in proxy.requests if r.method == "HEAD"]


@pytest.mark.parametrize("retry_after", [float("nan"), float("inf"), -5.0, 1e300],
                         ids=["nan", "inf", "negative", "huge"])
def test_a_503_with_a_garbage_retry_after_is_retried_within_the_backoff(
        moto_s3: MotoS3Server, retry_after: float) -> None:
    """``Retry-After: nan`` (or inf, negative, huge) at the first GET: the wait
    stays within ``backoff_max``, then the load reads every byte."""
    path = _put(moto_s3)
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        proxy.faults.status_script, proxy.faults.retry_after = [503], retry_after
        opts = moto_s3.options(s3_endpoint=proxy.url, backoff_max=0.2)
        with tensorstream.open(f"s3://{path}", sequential=True, **opts) as f:
            assert f.read() == DATA
        assert not proxy.faults.status_script
