"""Addressing S3 reads without a botocore client (``signing.PathStyle``): the
URLs are exactly botocore's, and the signatures are accepted by moto checking
SigV4."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.providers.s3.signing import PathStyle, path_style
from tensorstream.testing.s3_server import MotoS3Server

KEYS = [
    "model.tensors", "a/b/c.bin", "sp ace/plus+sign.bin", "tilde~/%25 already-quoted",
    "unicode/ñandú-模型.bin", "q?x=1#frag", "semi;colon,comma&amp=eq@at$dollar",
    "star*paren()'quote!", "a//double/slash/", "./dot/../dots", "back\\slash",
]


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "https://minio.example:443/",
                                      "http://[::1]:9000"])
def test_path_style_urls_are_botocores(endpoint: str) -> None:
    import botocore.session

    client = botocore.session.Session().create_client(
        "s3", endpoint_url=endpoint, region_name="eu-west-3", aws_access_key_id="k",
        aws_secret_access_key="s",
        config=botocore.config.Config(s3={"addressing_style": "path"}))
    light = path_style(endpoint, "path", "eu-west-3")
    assert light is not None
    for bucket in ("bucket", "my.dotted.bucket", "b-1"):
        for key in KEYS:
            want = client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}).split("?", 1)[0]
            assert light.url(bucket, key) == want, (bucket, key)


def test_path_style_only_where_the_url_is_fixed() -> None:
    assert path_style("http://h:1", "path", "r") == PathStyle("http://h:1", "r")
    assert path_style(None, "path", "r") is None  # AWS: endpoint rules decide
    assert path_style("http://h:1", "virtual", "r") is None
    assert path_style("http://h:1", "auto", "r") is None
    assert path_style("http://h:1", "path", None) is None  # region from a profile
    assert path_style("http://h:1/prefix", "path", "r") is None


def test_reads_with_static_keys_build_no_client(moto_s3: MotoS3Server, isolated_env: Path) -> None:
    key = f"light/{uuid.uuid4().hex[:10]}"
    moto_s3.put(S3_BUCKET, key, b"x" * 5000)
    uri = f"s3://{S3_BUCKET}/{key}"
    with tensorstream.open(uri, **moto_s3.options()) as f:  # moto checks each signature
        assert f.read() == b"x" * 5000
        assert f._provider.inner._sync_client is None  # no botocore client was built
    # A wrong secret is refused as ever: the light path signs for real.
    with pytest.raises(PermissionError):
        with tensorstream.open(uri, **moto_s3.options(s3_secret_access_key="wrong")) as f:
            f.read()


async def test_listing_without_a_client_matches_botocores(moto_s3: MotoS3Server,
                                                          isolated_env: Path) -> None:
    base = f"lightlist-{uuid.uuid4().hex[:8]}"
    keys = [f"{base}/{k}" for k in ("plain.bin", "sp ace.bin", "plus+sign.bin", "ñandú/模型.bin",
                                    "pct%25.bin", "amp&eq=.bin", "tilde~.bin")]
    for i, key in enumerate(keys):
        moto_s3.put(S3_BUCKET, key, b"y" * (i + 1))
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/", **moto_s3.options()) as p:
        got = [(i.path, i.size, i.etag, i.mtime) async for i in p.list(f"{S3_BUCKET}/{base}/")]
        assert p.inner._sync_client is None  # listed by signed GETs on the data plane
    want = moto_s3.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{base}/")["Contents"]
    assert got == [(f"{S3_BUCKET}/{o['Key']}", o["Size"], o["ETag"], o["LastModified"])
                   for o in want]


def test_no_region_and_no_config_file_signs_for_us_east_1_without_a_client(
        moto_s3: MotoS3Server, isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What botocore does with a custom endpoint and no region anywhere, known
    # without building its client (~0.1-0.3 s of every `cp` process).
    key = f"light/{uuid.uuid4().hex[:10]}"
    moto_s3.put(S3_BUCKET, key, b"z" * 3000)
    uri = f"s3://{S3_BUCKET}/{key}"
    options = {k: v for k, v in moto_s3.options().items() if k != "s3_region"}
    monkeypatch.setenv("AWS_CONFIG_FILE", str(isolated_env / "no-such-config"))
    with tensorstream.open(uri, **options) as f:
        assert f.read() == b"z" * 3000
        assert f._provider.inner._sync_client is None
    # A config file may name a region (or an endpoint): then botocore reads it.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(isolated_env / "empty-config"))
    with tensorstream.open(uri, **options) as f:
        assert f.read() == b"z" * 3000
        assert f._provider.inner._sync_client is not None
