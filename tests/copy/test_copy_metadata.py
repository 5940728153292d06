"""What ``cp`` stores with each S3 object: the Content-Type guessed from a local file's
name, an S3 source's Content-Type and user metadata carried across endpoints, the
caller's fields over both, the same whether S3 copies the object or the bytes go through
this machine. moto's servers on loopback, read back with HEAD (boto3)."""

from __future__ import annotations

import datetime
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream.copy.engine import copy
from tensorstream.errors import ConfigurationError
from tensorstream.providers.s3.metadata import MetadataOptions

MiB = 1 << 20
EXPIRES = datetime.datetime(2031, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)


def _prefix() -> str:
    return f"meta-{secrets.token_hex(4)}"


def _head(server: Any, key: str) -> dict[str, Any]:
    return dict(server.client.head_object(Bucket=S3_BUCKET, Key=key))


def _uri(key: str) -> str:
    return f"s3://{S3_BUCKET}/{key}"


def test_an_upload_gets_the_content_type_of_its_name_as_with_aws_s3_cp(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp config.json s3://...`` sent no Content-Type: S3 stored binary/octet-stream, so
    a browser or HTTP client given the object's URL saw no JSON. Now guessed from the name
    as ``aws s3 cp`` guesses it; a name with no known type still sends none."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "README.txt").write_text("hi")
    (tmp_path / "m" / "model.safetensors").write_bytes(os.urandom(100))
    (tmp_path / "m" / "big.json").write_bytes(b" " * (11 * MiB))  # a multipart upload
    p = _prefix()
    r = copy(str(tmp_path / "m"), _uri(p) + "/", recursive=True, part_size=5 * MiB,
             **moto_s3.options())
    assert r.ok and r.files == 4, r.errors
    assert _head(moto_s3, f"{p}/config.json")["ContentType"] == "application/json"
    assert _head(moto_s3, f"{p}/big.json")["ContentType"] == "application/json"
    assert _head(moto_s3, f"{p}/README.txt")["ContentType"] == "text/plain"
    head = _head(moto_s3, f"{p}/model.safetensors")
    assert head["ContentType"] == "binary/octet-stream" and head["Metadata"] == {}


def test_no_guess_mime_type_sends_none(tmp_path: Path, moto_s3: Any) -> None:
    (tmp_path / "config.json").write_text("{}")
    key = f"{_prefix()}/config.json"
    r = copy(str(tmp_path / "config.json"), _uri(key),
             object_metadata=MetadataOptions(guess_mime_type=False), **moto_s3.options())
    assert r.ok, r.errors
    assert _head(moto_s3, key)["ContentType"] == "binary/octet-stream"


@pytest.mark.parametrize("size", [100, 11 * MiB], ids=["one-put", "multipart"])
def test_content_type_cache_control_and_metadata_given_are_stored(
        tmp_path: Path, moto_s3: Any, size: int) -> None:
    src = tmp_path / "config.json"
    src.write_bytes(b" " * size)
    key = f"{_prefix()}/c.json"
    opts = MetadataOptions(content_type="application/x-weights", cache_control="max-age=60",
                           metadata={"Revision": "abc123", "team": "ml"})
    r = copy(str(src), _uri(key), object_metadata=opts, part_size=5 * MiB,
             **moto_s3.options())
    assert r.ok, r.errors
    head = _head(moto_s3, key)
    assert head["ContentType"] == "application/x-weights"
    assert head["CacheControl"] == "max-age=60"
    assert head["Metadata"] == {"revision": "abc123", "team": "ml"}


def _put_source(server: Any, key: str, data: bytes) -> None:
    server.client.put_object(Bucket=S3_BUCKET, Key=key, Body=data, ContentType="x-model/w",
                             CacheControl="no-cache", Metadata={"sha": "abc"},
                             ContentDisposition='attachment; filename="m.bin"',
                             ContentLanguage="en", Expires=EXPIRES)


@pytest.mark.parametrize("size", [100, 11 * MiB], ids=["one-put", "multipart"])
@pytest.mark.parametrize("recursive", [False, True], ids=["object", "listed"])
def test_a_copy_between_two_endpoints_keeps_the_sources_metadata(
        moto_s3: Any, moto_s3_tls: Any, size: int, recursive: bool) -> None:
    """S3 -> S3 between two endpoints streams the bytes: the copy had no Content-Type
    (binary/octet-stream) and none of the source's user metadata, where ``aws s3 cp``
    and a server-side copy keep both. Now carried, for a listed source too (a listing
    names no metadata: one HEAD)."""
    p = _prefix()
    data = os.urandom(size)
    _put_source(moto_s3, f"{p}/src/m.bin", data)
    src, dst = (_uri(f"{p}/src/"), _uri(f"{p}/dst/")) if recursive else (
        _uri(f"{p}/src/m.bin"), _uri(f"{p}/dst/m.bin"))
    r = copy(src, dst, recursive=recursive, part_size=5 * MiB,
             src_options=moto_s3.options(), dst_options=moto_s3_tls.options())
    assert r.ok and r.files == 1, r.errors
    assert moto_s3_tls.get(S3_BUCKET, f"{p}/dst/m.bin") == data
    head = _head(moto_s3_tls, f"{p}/dst/m.bin")
    assert head["ContentType"] == "x-model/w" and head["CacheControl"] == "no-cache"
    assert head["Metadata"] == {"sha": "abc"}
    assert head["ContentDisposition"] == 'attachment; filename="m.bin"'
    assert head["ContentLanguage"] == "en" and head["Expires"] == EXPIRES


@pytest.mark.parametrize("server_side", [True, False], ids=["server-side", "streamed"])
@pytest.mark.parametrize("size", [100, 11 * MiB], ids=["one-piece", "parts"])
def test_fields_given_replace_the_sources_the_same_on_both_paths(
        moto_s3: Any, server_side: bool, size: int) -> None:
    """``--metadata`` replaces the source's user metadata as a whole and
    ``--content-type`` its type; the fields not given (Cache-Control) are carried. One
    CopyObject kept the source's (COPY), whatever was asked."""
    p = _prefix()
    _put_source(moto_s3, f"{p}/src/m.bin", os.urandom(size))
    opts = MetadataOptions(content_type="application/x-new", metadata={"rev": "2"})
    r = copy(_uri(f"{p}/src/m.bin"), _uri(f"{p}/dst/m.bin"), object_metadata=opts,
             server_side_copy=server_side, copy_cutoff=5 * MiB, part_size=5 * MiB,
             **moto_s3.options())
    assert r.ok and r.outcomes[0].server_side == server_side, r.errors
    head = _head(moto_s3, f"{p}/dst/m.bin")
    assert head["ContentType"] == "application/x-new" and head["Metadata"] == {"rev": "2"}
    assert head["CacheControl"] == "no-cache" and head["Expires"] == EXPIRES


def test_metadata_for_a_destination_that_keeps_none_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    with pytest.raises(ConfigurationError, match="keeps none"):
        copy(str(tmp_path / "a"), str(tmp_path / "b"),
             object_metadata=MetadataOptions(content_type="text/plain"))
    assert not (tmp_path / "b").exists()


def test_open_for_writing_takes_content_type_and_metadata(moto_s3: Any) -> None:
    import tensorstream

    key = f"{_prefix()}/w.json"
    with tensorstream.open(_uri(key), "wb", content_type="application/json",
                           metadata={"rev": "7"}, **moto_s3.options()) as f:
        f.write(b"{}")
    head = _head(moto_s3, key)
    assert head["ContentType"] == "application/json" and head["Metadata"] == {"rev": "7"}
    key = f"{_prefix()}/plain.json"  # the neighbour: nothing asked, nothing guessed
    with tensorstream.open(_uri(key), "wb", **moto_s3.options()) as f:
        f.write(b"{}")
    assert _head(moto_s3, key)["ContentType"] == "binary/octet-stream"
    with pytest.raises(ConfigurationError, match="US-ASCII"):
        tensorstream.open(_uri(key), "wb", metadata={"k": "caf\u00e9"}, **moto_s3.options())
    # (a value read from a file, its line break kept: it passed, and the upload failed
    # as "cannot reach http://127.0.0.1:...: HTTPClientError", retried)
    with pytest.raises(ConfigurationError, match="US-ASCII"):
        tensorstream.open(_uri(key), "wb", metadata={"sha": "abc\n"}, **moto_s3.options())


def test_open_for_writing_a_local_file_refuses_metadata(tmp_path: Path) -> None:
    import tensorstream

    with pytest.raises(ConfigurationError, match="keeps none"):
        tensorstream.open(str(tmp_path / "a.json"), "wb", content_type="application/json")
    assert not (tmp_path / "a.json").exists()


@pytest.mark.parametrize(("name", "want"), [("config.json", "application/json"),
                                            ("model.safetensors", "binary/octet-stream")])
def test_an_object_from_http_gets_the_type_of_its_name(
        moto_s3: Any, http_server: Any, name: str, want: str) -> None:
    """From HTTP(S) (a model hub): guessed from the name like a local file's, not taken
    from the server's answer (servers send text/plain or octet-stream for either)."""
    p = _prefix()
    http_server.put(f"{p}/{name}", b"{}")
    r = copy(http_server.url(f"{p}/{name}"), _uri(f"{p}/{name}"), dst_options=moto_s3.options())
    assert r.ok, r.errors
    assert _head(moto_s3, f"{p}/{name}")["ContentType"] == want


def _put_raw_utf8_metadata(server: Any, key: str, data: bytes) -> None:
    """A source whose user metadata S3 would not take (raw UTF-8, as another store
    hands it back): botocore's own check is lifted for this one upload."""
    from botocore.handlers import validate_ascii_metadata

    events = server.client.meta.events
    events.unregister("before-parameter-build.s3.PutObject", validate_ascii_metadata)
    try:
        server.client.put_object(Bucket=S3_BUCKET, Key=key, Body=data,
                                 Metadata={"token": "s3cr\u00e9t-value"})
    finally:
        events.register("before-parameter-build.s3.PutObject", validate_ascii_metadata)


@pytest.mark.parametrize(("server_side", "size", "given"), [
    (True, 11 * MiB, None),                       # S3's multipart copy carries it
    (True, 100, MetadataOptions(content_type="a/b")),  # CopyObject with REPLACE
    (False, 100, None),                           # streamed (fixed before)
], ids=["server-side-parts", "server-side-replace", "streamed"])
def test_a_sources_metadata_s3_would_refuse_is_named_not_quoted_on_both_paths(
        moto_s3_public: Any, server_side: bool, size: int,
        given: MetadataOptions | None) -> None:
    """The server-side copy sent the source's metadata to botocore unchecked: its refusal
    quoted the value ('Non ascii characters found in S3 metadata for key "token", value:
    "s3crét-value"'); only the streamed copy named the key. Now both say the same, and
    nothing is written."""
    p = _prefix()
    _put_raw_utf8_metadata(moto_s3_public, f"{p}/m", os.urandom(size))
    r = copy(_uri(f"{p}/m"), _uri(f"{p}/d"), object_metadata=given, server_side_copy=server_side,
             copy_cutoff=5 * MiB, part_size=5 * MiB, **moto_s3_public.options())
    assert not r.ok and len(r.errors) == 1
    assert "source's user metadata cannot be stored in S3" in r.errors[0], r.errors
    assert "metadata key 'token'" in r.errors[0] and "t-value" not in r.errors[0]
    listed = moto_s3_public.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{p}/d")
    assert listed.get("KeyCount") == 0


@pytest.mark.parametrize("server_side", [True, False], ids=["server-side", "streamed"])
def test_metadata_given_over_a_source_s3_would_refuse_is_copied(
        moto_s3_public: Any, server_side: bool) -> None:
    # The neighbour: --metadata replaces the source's as a whole, so nothing is refused.
    p = _prefix()
    data = os.urandom(11 * MiB)
    _put_raw_utf8_metadata(moto_s3_public, f"{p}/m", data)
    r = copy(_uri(f"{p}/m"), _uri(f"{p}/d"), object_metadata=MetadataOptions(metadata={"k": "v"}),
             server_side_copy=server_side, copy_cutoff=5 * MiB, part_size=5 * MiB,
             **moto_s3_public.options())
    assert r.ok, r.errors
    assert moto_s3_public.get(S3_BUCKET, f"{p}/d") == data
    assert _head(moto_s3_public, f"{p}/d")["Metadata"] == {"k": "v"}
