"""Writes to S3 under server-side encryption, where S3's ETag is not the MD5 of the
bytes though it looks like one (SSE-KMS, SSE-C): a write must not be taken for
damaged and deleted. moto answers MD5 ETags whatever the encryption, so a proxy in
front of it answers as S3 does: the encryption header, and an ETag of 32 other hex
digits (``-N`` for a multipart object): :mod:`s3_encrypting_front`."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from s3_encrypting_front import EncryptingFront
from tensorstream.copy.engine import CopyResult, copy
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

MiB = 1 << 20


@pytest.fixture
def options(moto_s3: MotoS3Server) -> dict[str, Any]:
    return {**moto_s3.options(), "part_size": 5 * MiB}


def _copied(moto: MotoS3Server, options: dict[str, Any], headers: dict[str, str],
            data: bytes, tmp_path: Path) -> tuple[str, list[str], CopyResult]:
    """``data`` copied from a local file to S3 (the copy path checks what S3 answered)."""
    key = f"encrypted/{uuid.uuid4().hex}"
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    # (keys: the removal of a copy that failed its check is conditional on its ETag, a
    # header the front maps, and so signs anew)
    keys = (options["s3_access_key_id"], options["s3_secret_access_key"], options["s3_region"])
    with EncryptingFront(options["s3_endpoint"], headers, keys=keys) as front:
        opts = {**options, "s3_endpoint": f"http://127.0.0.1:{front.port}"}
        result = copy(str(src), f"s3://{S3_BUCKET}/{key}", **opts)
        return key, front.methods, result


@pytest.mark.parametrize("headers", [
    {"x-amz-server-side-encryption": "aws:kms"},
    {"x-amz-server-side-encryption": "aws:kms:dsse"},
    {"x-amz-server-side-encryption-customer-algorithm": "AES256"},
])
@pytest.mark.parametrize("size", [1000, 11 * MiB], ids=["one PutObject", "multipart"])
def test_an_encrypted_write_is_kept_not_taken_for_damaged(
        moto_s3: MotoS3Server, options: dict[str, Any], headers: dict[str, str],
        size: int, tmp_path: Path) -> None:
    # Every such copy was compared with an ETag that is no MD5, failed as "verification
    # failed", and (one PutObject) deleted again.
    data = os.urandom(size)
    key, methods, result = _copied(moto_s3, options, headers, data, tmp_path)
    assert result.ok, result.errors
    assert moto_s3.get(S3_BUCKET, key) == data
    assert "DELETE" not in methods


@pytest.mark.parametrize("size", [1000, 11 * MiB], ids=["one PutObject", "multipart"])
@pytest.mark.parametrize("headers", [{"x-amz-server-side-encryption": "AES256"}, {}],
                         ids=["SSE-S3", "none"])
def test_an_md5_etag_that_differs_is_still_damage(
        moto_s3: MotoS3Server, options: dict[str, Any], headers: dict[str, str],
        size: int, tmp_path: Path) -> None:
    # SSE-S3 (AES256) and no encryption keep the MD5 ETag: another one is still caught
    # (this is also the test's premise: the front's ETags are not moto's).
    key, _, result = _copied(moto_s3, options, headers, os.urandom(size), tmp_path)
    assert not result.ok and "verification failed" in result.errors[0], result.errors
    assert not moto_s3.exists(S3_BUCKET, key)
