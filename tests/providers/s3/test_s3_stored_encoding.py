"""An S3 object stored with ``Content-Encoding`` (``aws s3 cp --content-encoding gzip``):
S3 keeps the header as metadata and sends the bytes as stored, so every front door
reads them exactly (they were refused: "refusing a ranged body: Content-Encoding gzip"),
and a copy carries the header on. Plain HTTP servers' content codings stay refused."""

from __future__ import annotations

import asyncio
import gzip
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.copy.engine import copy
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

MiB = 1 << 20


def _client(moto: MotoS3Server) -> Any:
    import boto3

    o = moto.options()
    return boto3.client("s3", endpoint_url=o["s3_endpoint"], region_name=o["s3_region"],
                        aws_access_key_id=o["s3_access_key_id"],
                        aws_secret_access_key=o["s3_secret_access_key"])


@pytest.fixture(params=["gzip", "br", "gzip, identity"])
def stored(request: pytest.FixtureRequest, moto_s3: MotoS3Server) -> tuple[str, bytes]:
    key = f"encoded/{uuid.uuid4().hex}.json.gz"
    data = gzip.compress(os.urandom(3 * MiB), compresslevel=1)  # incompressible: ~3 MiB
    _client(moto_s3).put_object(Bucket=S3_BUCKET, Key=key, Body=data,
                                ContentEncoding=request.param, ContentType="application/json")
    return f"s3://{S3_BUCKET}/{key}", data


def test_every_front_door_reads_the_stored_bytes(moto_s3: MotoS3Server,
                                                 stored: tuple[str, bytes]) -> None:
    uri, data = stored
    opts = moto_s3.options()
    with tensorstream.open(uri, **opts) as f:
        assert f.read() == data
    got = asyncio.run(tensorstream.read_range(uri, 1000, 2_000_000, **opts))
    assert got == data[1000:2_000_000]
    with tensorstream.open(uri, readahead=1 << 20, **opts) as f:
        f.seek(len(data) - 100)
        assert f.read() == data[-100:]


def test_a_copy_to_disk_and_to_another_store_keeps_bytes_and_header(
        moto_s3: MotoS3Server, stored: tuple[str, bytes], tmp_path: Path) -> None:
    uri, data = stored
    opts = moto_s3.options()
    local = tmp_path / "x.json.gz"
    result = copy(uri, str(local), part_size=MiB, **opts)
    assert result.ok, result.errors
    assert local.read_bytes() == data
    # S3 -> S3 streamed (not copied by S3 itself): the header goes with the bytes
    dst = f"s3://{S3_BUCKET}/encoded-copy/{uuid.uuid4().hex}"
    result = copy(uri, dst, server_side_copy=False, part_size=5 * MiB, **opts)
    assert result.ok, result.errors
    head = _client(moto_s3).head_object(Bucket=S3_BUCKET, Key=dst.split("/", 3)[3])
    assert head["ContentEncoding"] == _client(moto_s3).head_object(
        Bucket=S3_BUCKET, Key=uri.split("/", 3)[3])["ContentEncoding"]
    assert moto_s3.get(S3_BUCKET, dst.split("/", 3)[3]) == data
