"""Reliability: a URI names exactly one object, never a neighbour (issue 15, class 4).

``s3://b/q?v=2`` is the key ``q?v=2`` (as for ``aws s3`` and s5cmd), never ``q``;
Redis and ``file://`` URIs whose query or fragment would be dropped are refused.
Each test puts the neighbour the old parser would have read next to the named object,
on a real server, so reading the wrong one fails the test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from reliability_helpers import FAST, unique
from tensorstream import errors
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(120)]


def _s3(server: MotoS3Server) -> dict[str, object]:
    return {**server.options(), **FAST}


def _read(uri: str, **options: object) -> bytes:
    with tensorstream.open(uri, **options) as f:
        return f.read()


@pytest.mark.parametrize("suffix", ["?v=2", "#v=2", "?versionId=x", "%3Fv=2", "%20x", "%", "//x",
                                    "?", "#", "/", "a:b@c"])
@pytest.mark.parametrize("stream_reads", [False, True])
def test_s3_keeps_every_character_after_the_bucket_in_the_key(
        moto_s3_public: MotoS3Server, suffix: str, stream_reads: bool) -> None:
    base = unique("q")
    named, neighbour = base + suffix, base
    moto_s3_public.put(S3_BUCKET, neighbour, b"the neighbour q")
    moto_s3_public.put(S3_BUCKET, named, b"the named object " + suffix.encode())
    opts = _s3(moto_s3_public) | {"stream_reads": stream_reads}
    uri = f"s3://{S3_BUCKET}/{named}"
    assert _read(uri, **opts) == b"the named object " + suffix.encode()
    info = tensorstream._loop.run_sync(tensorstream.stat(uri, **opts))
    assert info.size == len(b"the named object " + suffix.encode())


def test_s3_key_that_does_not_exist_is_not_found_even_if_its_prefix_does(
        moto_s3_public: MotoS3Server) -> None:
    base = unique("q")
    moto_s3_public.put(S3_BUCKET, base, b"q")
    for suffix in ("?v=2", "#v=2"):
        with pytest.raises(errors.NotFoundError):
            _read(f"s3://{S3_BUCKET}/{base}{suffix}", **_s3(moto_s3_public))


def test_s3_write_goes_to_the_key_with_its_query_and_fragment_characters(
        moto_s3_public: MotoS3Server) -> None:
    base = unique("w")
    for suffix in ("?v=2", "#v=2"):
        with tensorstream.open(f"s3://{S3_BUCKET}/{base}{suffix}", "wb",
                               **_s3(moto_s3_public)) as f:
            f.write(b"written " + suffix.encode())
        assert moto_s3_public.get(S3_BUCKET, base + suffix) == b"written " + suffix.encode()
    with pytest.raises(Exception):  # noqa: B017 - the bare prefix was never written
        moto_s3_public.get(S3_BUCKET, base)


@pytest.mark.parametrize("bad", ["s3://bucket?x/k", "s3://bucket#x/k", "s3://b%41/k",
                                 "s3://user:pw@bucket/k"])
def test_s3_bucket_with_uri_delimiters_is_refused(bad: str) -> None:
    with pytest.raises(errors.InvalidURIError, match="s3://bucket/key"):
        tensorstream.uri.parse_uri(bad)


@pytest.mark.parametrize("suffix", ["#v=2", "?v=2", "?", "#", "?db=0#x", "?token=1"])
def test_redis_query_or_fragment_that_would_be_dropped_is_refused(
        redis_server: RedisServer, suffix: str) -> None:
    key = unique("q")
    redis_server.put(key, b"the neighbour q")
    with pytest.raises(errors.InvalidURIError) as info:
        _read(redis_server.url(key) + suffix)
    assert "percent-encode" in str(info.value)


def test_redis_percent_escapes_name_the_key_with_those_characters(
        redis_server: RedisServer) -> None:
    key = unique("q")
    redis_server.put(key, b"the neighbour q")
    redis_server.put(key + "#v=2", b"hash key")
    redis_server.put(key + "?v=2", b"query key")
    assert _read(redis_server.url(key + "%23v=2")) == b"hash key"
    assert _read(redis_server.url(key + "%3Fv=2")) == b"query key"
    assert _read(redis_server.url(key) + "?db=0") == b"the neighbour q"


def test_file_uri_query_or_fragment_is_refused_and_a_plain_path_keeps_them(
        tmp_path: Path) -> None:
    (tmp_path / "q").write_bytes(b"the neighbour q")
    (tmp_path / "q?v=2").write_bytes(b"query file")
    (tmp_path / "q#v=2").write_bytes(b"hash file")
    for suffix in ("?v=2", "#v=2"):
        with pytest.raises(errors.InvalidURIError, match="percent-encode"):
            _read(f"file://{tmp_path}/q{suffix}")
    assert _read(f"file://{tmp_path}/q%3Fv=2") == b"query file"
    assert _read(f"file://{tmp_path}/q%23v=2") == b"hash file"
    assert _read(os.path.join(tmp_path, "q?v=2")) == b"query file"
    assert _read(os.path.join(tmp_path, "q#v=2")) == b"hash file"


def test_a_local_name_that_is_not_utf8_is_refused_as_an_s3_key(moto_s3: MotoS3Server,
                                                                tmp_path: Path) -> None:
    """A file named in another encoding (bytes 0xff 0xfe: surrogate escapes in Python) has no
    S3 key: refused by name before the upload ('S3 sent a malformed answer
    (UnicodeEncodeError)' came after every part was sent), the other files copied."""
    from tensorstream.copy.engine import copy

    src = tmp_path / "src"
    src.mkdir()
    (src / os.fsdecode(b"\xff\xfe.bin")).write_bytes(b"latin")
    (src / "ok.bin").write_bytes(b"ok")
    prefix = unique("nonutf8")
    result = copy(str(src), f"s3://{S3_BUCKET}/{prefix}/", recursive=True, **_s3(moto_s3))
    assert len(result.errors) == 1 and "S3 keys are UTF-8" in result.errors[0]
    assert "malformed answer" not in result.errors[0]
    assert _read(f"s3://{S3_BUCKET}/{prefix}/ok.bin", **_s3(moto_s3)) == b"ok"
    assert moto_s3.open_multipart_uploads(S3_BUCKET, prefix) == []
    with pytest.raises(errors.InvalidURIError, match="S3 keys are UTF-8"):
        _read(f"s3://{S3_BUCKET}/{prefix}/" + os.fsdecode(b"\xff.bin"), **_s3(moto_s3))


def test_a_redis_key_that_is_not_utf8_is_listed_copied_and_read_by_its_bytes(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """Redis keys are bytes: one that is not UTF-8 (``p/\\xffbad``) made ``ls`` and ``cp -r``
    of its whole prefix fail with a bare UnicodeEncodeError, nothing copied; ``%FF`` in a
    URI named ``\\xef\\xbf\\xbd`` (U+FFFD), another key. Now it is listed, copied to a
    file with the same bytes and to Redis (a manifest, read back), and ``%FF`` names it."""
    from tensorstream.copy.engine import copy

    prefix = unique("nonutf8")
    with redis_server.client() as c:
        c.set(f"{prefix}/".encode() + b"\xffbad", b"latin")
        c.set(f"{prefix}/".encode() + b"\xef\xbf\xbdbad", b"the neighbour U+FFFD")
        c.set(f"{prefix}/ok", b"ok")
    assert _read(redis_server.url(f"{prefix}/%FFbad")) == b"latin"
    listed = tensorstream._loop.run_sync(_list(redis_server.url(f"{prefix}/")))
    assert sorted(listed) == sorted([f"{prefix}/ok", f"{prefix}/\udcffbad", f"{prefix}/\ufffdbad"])

    result = copy(redis_server.url(f"{prefix}/"), str(tmp_path / "out"), recursive=True)
    assert result.ok and result.files == 3, result.errors
    assert (tmp_path / "out" / os.fsdecode(b"\xffbad")).read_bytes() == b"latin"
    assert (tmp_path / "out" / "ok").read_bytes() == b"ok"

    result = copy(str(tmp_path / "out"), redis_server.url(f"{prefix}-copy/"), recursive=True)
    assert result.ok and result.files == 3, result.errors
    assert _read(redis_server.url(f"{prefix}-copy/%FFbad")) == b"latin"
    assert _read(redis_server.url(f"{prefix}-copy/%EF%BF%BDbad")) == b"the neighbour U+FFFD"


async def _list(uri: str) -> list[str]:
    from tensorstream.api import get_provider
    from tensorstream.uri import parse_uri

    parsed = parse_uri(uri)
    async with get_provider(parsed) as provider:
        return [info.path async for info in provider.list(parsed.path)]
