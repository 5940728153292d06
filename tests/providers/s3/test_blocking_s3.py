"""The blocking S3 data path (``S3Provider.readinto_blocking``): presigned
ranged GETs on http.client against moto with SigV4 checking on."""

from __future__ import annotations

import logging
import os
import random
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from fixtures_s3 import S3_BUCKET, s3_provider
from tensorstream import errors
from tensorstream.config import split_options
from tensorstream.providers.base import Pin
from tensorstream.providers.s3.provider import S3Provider
from tensorstream.testing.s3_server import MotoS3Server
from tensorstream.uri import parse_uri

pytestmark = pytest.mark.usefixtures("isolated_env")

DATA = os.urandom((1 << 20) + 999)


def _put(server: MotoS3Server, data: bytes = DATA) -> str:
    key = f"blk/{uuid.uuid4().hex[:10]}.bin"
    server.put(S3_BUCKET, key, data)
    return f"{S3_BUCKET}/{key}"


def _read(p: S3Provider, path: str, offset: int, size: int, etag: str | None = None) -> bytes:
    buf = bytearray(size)
    assert p.readinto_blocking(path, offset, memoryview(buf),
                               pin=Pin(etag=etag) if etag else None) == size
    return bytes(buf)


def test_signed_ranges_from_many_threads(moto_s3: MotoS3Server) -> None:
    path = _put(moto_s3)
    p = s3_provider(moto_s3)
    assert S3Provider.capabilities.blocking_reads
    etag = moto_s3.client.head_object(Bucket=S3_BUCKET, Key=path.split("/", 1)[1])["ETag"]
    rng = random.Random(3)
    ranges = [(rng.randrange(len(DATA) - 70_000), rng.randint(1, 70_000)) for _ in range(24)]
    ranges += [(0, len(DATA)), (len(DATA) - 1, 1)]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda r: _read(p, path, r[0], r[1], etag), ranges))
    assert got == [DATA[o : o + n] for o, n in ranges]
    assert len(p._gets._urls) == 1  # one resolved URL, reused by every read of the key
    # ... and one SigV4 signature (Range and If-Match travel unsigned), which moto,
    # checking signatures, accepted for every range above.
    assert len(p._gets._signatures) == 1
    (signed, _), = p._gets._signatures.values()
    assert "range" not in signed["Authorization"].lower().split("signedheaders=")[1].split(",")[0]
    # (moto's werkzeug server closes every connection, so no keep-alive check here)


def test_pinned_and_past_the_end(moto_s3: MotoS3Server) -> None:
    path = _put(moto_s3)
    p = s3_provider(moto_s3)
    with pytest.raises(errors.ObjectChangedError):
        _read(p, path, 0, 10, '"0123456789abcdef0123456789abcdef"')
    with pytest.raises(errors.InvalidRangeError):
        _read(p, path, len(DATA) + 5, 10)
    with pytest.raises(errors.InvalidRangeError):
        _read(p, path, len(DATA) - 5, 10)


def test_missing_object_is_not_found(moto_s3: MotoS3Server) -> None:
    p = s3_provider(moto_s3)
    with pytest.raises(errors.NotFoundError, match="NoSuchKey"):
        _read(p, f"{S3_BUCKET}/blk/missing-{uuid.uuid4().hex}", 0, 10)


def test_wrong_secret_is_refused_and_no_secret_leaks(
        moto_s3: MotoS3Server, caplog: pytest.LogCaptureFixture) -> None:
    path = _put(moto_s3)
    caplog.set_level(logging.DEBUG)
    canary = "wrong-secret-canary-Zq81"
    p = s3_provider(moto_s3, s3_secret_access_key=canary)
    with pytest.raises(errors.PermissionDeniedError, match="SignatureDoesNotMatch") as info:
        _read(p, path, 0, 10)
    text = f"{info.value} {info.value!r} {info.value.path} {caplog.text} {p!r}"
    assert canary not in text
    assert all("?" not in url for url in p._gets._urls.values())  # no signature in cached URLs


def test_session_token_is_sent_and_never_shown(
        moto_s3: MotoS3Server, caplog: pytest.LogCaptureFixture) -> None:
    path = _put(moto_s3)
    caplog.set_level(logging.DEBUG)
    canary = "session-token-canary-Xy77"
    p = s3_provider(moto_s3, s3_session_token=canary)
    with pytest.raises(errors.PermissionDeniedError) as info:  # moto: token unknown
        _read(p, path, 0, 10)
    text = f"{info.value} {info.value!r} {info.value.path} {caplog.text} {p!r}"
    assert canary not in text


def test_unicode_and_spaced_keys(moto_s3: MotoS3Server) -> None:
    key = f"blk/dir with space/ü-{uuid.uuid4().hex[:6]}+x.bin"
    moto_s3.put(S3_BUCKET, key, DATA[:5000])
    assert _read(s3_provider(moto_s3), f"{S3_BUCKET}/{key}", 100, 4900) == DATA[100:5000]


def test_tls_needs_the_ca_bundle(moto_s3_tls: MotoS3Server) -> None:
    path = _put(moto_s3_tls)
    assert _read(s3_provider(moto_s3_tls), path, 5, 500) == DATA[5:505]
    common, own = split_options({k: v for k, v in moto_s3_tls.options().items()
                                 if k != "ca_bundle"})
    p = S3Provider.from_uri(parse_uri(f"s3://{path}"), config=common, **own)
    with pytest.raises(errors.ConnectionFailedError, match=r"(?i)certificate") as info:
        _read(p, path, 0, 10)
    assert not info.value.temporary
