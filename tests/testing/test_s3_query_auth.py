"""Presigned URLs and unsigned requests on ``tensorstream_s3``'s signature-checking
moto server (``tensorstream.testing.s3_query_auth``): moto checks only an
``Authorization`` header and answered every other request with a 500 HTML page."""

from __future__ import annotations

import time
import urllib.parse

import boto3
import pytest
import requests
from botocore.config import Config

SIGS = ["s3v4", "s3"]  # SigV4 query auth, and SigV2's (boto3's presign default in us-east-1)


def _presign(backend, sig: str, method: str = "get_object", *, key: str = "m.bin",
             secret: str | None = None, expires: int = 60, **params) -> str:
    opts = backend.options
    client = boto3.session.Session().client(
        "s3", endpoint_url=opts["s3_endpoint"], region_name=opts["s3_region"],
        aws_access_key_id=opts["s3_access_key_id"],
        aws_secret_access_key=secret or opts["s3_secret_access_key"],
        config=Config(signature_version=sig))
    return client.generate_presigned_url(
        method, Params={"Bucket": backend.bucket, "Key": key, **params}, ExpiresIn=expires)


@pytest.mark.parametrize("sig", SIGS)
def test_a_presigned_get_is_served(tensorstream_s3, sig):
    tensorstream_s3.put("m.bin", b"abc" * 1000)
    url = _presign(tensorstream_s3, sig)
    r = requests.get(url, timeout=30)
    assert (r.status_code, r.content) == (200, b"abc" * 1000)
    r = requests.get(url, headers={"Range": "bytes=3-5"}, timeout=30)
    assert (r.status_code, r.content) == (206, b"abc")


@pytest.mark.parametrize("sig", SIGS)
def test_a_presigned_put_and_a_key_that_needs_quoting(tensorstream_s3, sig):
    key = "dir/a b+%41ü.bin"
    r = requests.put(_presign(tensorstream_s3, sig, "put_object", key=key), data=b"xyz",
                     timeout=30)
    assert r.status_code == 200, r.text
    assert tensorstream_s3.get(key) == b"xyz"
    assert requests.get(_presign(tensorstream_s3, sig, key=key), timeout=30).content == b"xyz"


@pytest.mark.parametrize("sig", SIGS)
def test_a_presigned_url_with_a_wrong_secret_is_refused(tensorstream_s3, sig):
    tensorstream_s3.put("m.bin", b"abc")
    r = requests.get(_presign(tensorstream_s3, sig, secret="wrong" * 8), timeout=30)
    assert r.status_code == 403
    assert b"<Code>SignatureDoesNotMatch</Code>" in r.content


@pytest.mark.parametrize("sig", SIGS)
def test_a_presigned_url_that_was_altered_is_refused(tensorstream_s3, sig):
    tensorstream_s3.put("m.bin", b"abc")
    tensorstream_s3.put("other.bin", b"secret")
    url = _presign(tensorstream_s3, sig).replace("/m.bin?", "/other.bin?")
    r = requests.get(url, timeout=30)
    assert r.status_code == 403 and b"SignatureDoesNotMatch" in r.content


@pytest.mark.parametrize("sig", SIGS)
def test_a_presigned_url_of_another_key_id_is_refused(tensorstream_s3, sig):
    tensorstream_s3.put("m.bin", b"abc")
    url = _presign(tensorstream_s3, sig)
    akid = tensorstream_s3.options["s3_access_key_id"]
    r = requests.get(url.replace(akid, "AKIAOTHERKEY0000000X"), timeout=30)
    assert r.status_code == 403 and b"<Code>InvalidAccessKeyId</Code>" in r.content


@pytest.mark.parametrize("sig", SIGS)
def test_an_expired_presigned_url_is_refused(tensorstream_s3, sig):
    tensorstream_s3.put("m.bin", b"abc")
    url = _presign(tensorstream_s3, sig, expires=1)
    time.sleep(2.1)
    r = requests.get(url, timeout=30)
    assert r.status_code == 403 and b"expired" in r.content


def test_an_unsigned_request_is_access_denied(tensorstream_s3):
    tensorstream_s3.put("m.bin", b"abc")
    r = requests.get(f"{tensorstream_s3.options['s3_endpoint']}/{tensorstream_s3.bucket}/m.bin",
                     timeout=30)
    assert r.status_code == 403 and b"<Code>AccessDenied</Code>" in r.content


def test_header_signed_requests_are_still_checked(tensorstream_s3):
    tensorstream_s3.put("m.bin", b"abc")
    opts = tensorstream_s3.options
    client = boto3.session.Session().client(
        "s3", endpoint_url=opts["s3_endpoint"], region_name=opts["s3_region"],
        aws_access_key_id=opts["s3_access_key_id"], aws_secret_access_key="wrong" * 8)
    with pytest.raises(client.exceptions.ClientError, match="SignatureDoesNotMatch"):
        client.get_object(Bucket=tensorstream_s3.bucket, Key="m.bin")


@pytest.mark.tensorstream_s3(auth=False)
@pytest.mark.parametrize("sig", SIGS)
def test_without_signature_checks_any_presigned_url_works(tensorstream_s3, sig):
    tensorstream_s3.put("m.bin", b"abc")
    url = _presign(tensorstream_s3, sig, secret="wrong" * 8)
    assert requests.get(url, timeout=30).content == b"abc"
    assert urllib.parse.urlsplit(url).query


@pytest.mark.tensorstream_s3(env=True)
def test_tensorizers_own_s3_reads_in_the_environment_mode(tensorstream_s3):
    # tensorizer's open_stream presigns its GETs for curl: it got moto's 500 page.
    stream_io = pytest.importorskip("tensorizer.stream_io")
    tensorstream_s3.put("m.bin", b"abc" * 1000)
    with stream_io.open_stream(f"s3://{tensorstream_s3.bucket}/m.bin", "rb") as f:
        assert f.read() == b"abc" * 1000
