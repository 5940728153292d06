"""A streamed S3 -> S3 copy of an object uploaded in parts writes the source's own part
layout (``HEAD ?partNumber=1``), so its ETag is the source's and ``sync`` skips it; and
``sync`` calls two multipart ETags of unknown layouts neither the same nor changed: the
dates decide. moto's server behind the package's fault proxy (requests counted)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from s3_parts import put_in_parts
from sync_runs import sync

MiB = 1 << 20


def _streamed(b: Any, **extra: Any) -> dict[str, Any]:
    """Options of a copy through this machine (not by S3), in 10 MiB parts."""
    return {**b.options, "server_side_copy": False, "part_size": 10 * MiB, **extra}


def _etag(b: Any, key: str) -> str:
    return str(b.client.head_object(Bucket=b.bucket, Key=key)["ETag"])


def _part_heads(b: Any) -> list[str]:
    return [q.path for q in b.requests if q.method == "HEAD" and "partNumber=" in q.path]


def test_a_streamed_copy_follows_the_sources_parts_and_the_next_sync_skips_it(
        tensorstream_s3: Any) -> None:
    """3 x 8 MiB parts (the last 4 MiB) copied with ``--part-size 10M``: the copy was
    written in 10 MiB parts (also 3), its ETag other than the source's, and every ``sync``
    compared the two ``-3`` ETags, called them changed and copied the object again. The
    copy now follows the source's parts (one ``HEAD ?partNumber=1``): same ETag, the next
    sync copies nothing and sends no part lookup."""
    b = tensorstream_s3
    data = os.urandom(20 * MiB)
    etag = put_in_parts(b, "src/m.bin", [data[:8 * MiB], data[8 * MiB:16 * MiB],
                                         data[16 * MiB:]])
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b)) == {"m.bin": "copied"}
    assert _part_heads(b) == [f"/{b.bucket}/src/m.bin?partNumber=1"]
    assert not [q for q in b.requests if "x-amz-copy-source" in q.headers]  # (streamed)
    assert _etag(b, "dst/m.bin") == etag
    assert b.get("dst/m.bin") == data
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b)) == {"m.bin": "skipped"}
    assert _part_heads(b) == [] and not [q for q in b.requests if q.method in ("PUT", "POST")]


def test_a_source_rewritten_after_its_copy_is_copied_again(tensorstream_s3: Any) -> None:
    """The neighbour: a same-size rewrite of the source (in other parts) after its copy is
    copied, by its date, and the new copy follows the new layout."""
    b = tensorstream_s3
    put_in_parts(b, "src/m.bin", [os.urandom(8 * MiB), os.urandom(8 * MiB), os.urandom(MiB)])
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b)) == {"m.bin": "copied"}
    time.sleep(1.1)  # (S3's dates are whole seconds)
    new = os.urandom(17 * MiB)
    etag = put_in_parts(b, "src/m.bin", [new[:6 * MiB], new[6 * MiB:12 * MiB], new[12 * MiB:]])
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b)) == {"m.bin": "copied"}
    assert b.get("dst/m.bin") == new and _etag(b, "dst/m.bin") == etag


@pytest.mark.parametrize(("parts", "options"), [
    # unequal parts (8, 6, 6 MiB): part 1 says 8 MiB and 3 parts, as 8/8/4 would be: the
    # copy's ETag is of those (also -3), not the source's
    ([8, 6, 6], {}),
    # parts larger than --part-size (memory): 12 + 12 + 1 MiB with --part-size 10M
    ([12, 12, 1], {}),
    # parts larger than --part-size given smaller (8M), the source's 10 MiB not followed
    ([10, 10, 3], {"part_size": 8 * MiB}),
], ids=["unequal", "larger-than-part-size", "explicit-smaller-part-size"])
def test_a_layout_not_followed_is_copied_in_our_parts_and_skipped_next(
        tensorstream_s3: Any, parts: list[int], options: dict[str, Any]) -> None:
    """A source whose layout the copy cannot follow (unequal parts; parts larger than
    ``--part-size``, which bounds the memory) is copied in ``--part-size`` parts: its ETag
    differs from the source's with the same count or not, and the next sync still skips it
    (the dates decide), where same-count ETags were taken as a change on every run (after
    a HEAD of the source, to learn whether its ETag is an MD5)."""
    b = tensorstream_s3
    data = [os.urandom(n * MiB) for n in parts]
    etag = put_in_parts(b, "src/m.bin", data)
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b, **options)) == {"m.bin": "copied"}
    assert b.get("dst/m.bin") == b"".join(data)
    assert _etag(b, "dst/m.bin") != etag
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b, **options)) == {"m.bin": "skipped"}
    # one HEAD, the copy's: the source's (was it encrypted?) would change nothing
    assert [q.path for q in b.requests if q.method == "HEAD"] == [f"/{b.bucket}/dst/m.bin"]


def test_a_single_part_source_sends_no_part_lookup(tensorstream_s3: Any) -> None:
    """One ``PutObject`` (its ETag the MD5 of the bytes): nothing to follow, no lookup."""
    b = tensorstream_s3
    data = os.urandom(12 * MiB)
    b.put("src/m.bin", data)
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b, part_size=5 * MiB)) == {
        "m.bin": "copied"}
    assert _part_heads(b) == [] and b.get("dst/m.bin") == data


def test_sync_compares_multipart_etags_only_when_equal() -> None:
    """The rule: two ``-N`` ETags that differ (the same count or not) say nothing of the
    bytes (parts of 8 MiB and of 10 MiB give 3 each for 20 MiB): the dates decide, a newer
    source is copied. Two MD5s of one ``PutObject`` each still decide whatever the dates."""
    from tensorstream.copy.select import source_encryption_decides, unchanged
    from tensorstream.providers.base import ObjectInfo

    def info(etag: str, mtime: float) -> ObjectInfo:
        return ObjectInfo(path="k", size=10, etag=etag, mtime=mtime)

    a3, b3, a1 = '"' + "a" * 32 + '-3"', '"' + "b" * 32 + '-3"', '"' + "a" * 32 + '"'
    b1 = '"' + "b" * 32 + '"'
    assert unchanged(info(a3, 0), info(b3, 1), same_kind=True)  # copy newer: a copy
    assert not unchanged(info(a3, 2), info(b3, 1), same_kind=True)  # source newer: changed
    assert unchanged(info(a3, 2), info(a3, 1), same_kind=True)  # equal: the same bytes
    assert not unchanged(info(a1, 0), info(b1, 1), same_kind=True)  # MD5s decide
    # (no HEAD of the source for multipart ETags: its encryption would change nothing)
    assert not source_encryption_decides(info(a3, 0), info(b3, 1), same_kind=True)
    assert source_encryption_decides(info(a1, 0), info(b1, 1), same_kind=True)


def test_a_store_that_does_not_answer_part_numbers_gets_our_parts(tensorstream_s3: Any) -> None:
    """A store that refuses ``HEAD ?partNumber=1`` (501 NotImplemented): the copy is
    written in ``--part-size`` parts, as before (one lookup, no retry, no failure), and
    the next sync skips it by its dates although both ETags are ``-3``."""
    b = tensorstream_s3
    data = [os.urandom(8 * MiB) for _ in range(3)]
    etag = put_in_parts(b, "src/m.bin", data)
    b.faults.raw.query = "partNumber"  # (the first such request is the lookup; parts after)
    b.faults.raw.status_script = [501]
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b)) == {"m.bin": "copied"}
    assert [q.status for q in b.requests if q.method == "HEAD" and "partNumber=" in q.path
            ] == [501]
    assert b.get("dst/m.bin") == b"".join(data)
    there = _etag(b, "dst/m.bin")
    assert there != etag and there.endswith('-3"')  # 10 + 10 + 4 MiB
    assert sync(b.uri("src/"), b.uri("dst/"), _streamed(b)) == {"m.bin": "skipped"}


@pytest.mark.tensorstream_s3(auth=False)  # (the front maps ETags back: no signature holds)
def test_an_sse_kms_source_in_parts_is_copied_once_and_a_change_again(
        tensorstream_s3: Any) -> None:
    """The neighbour: a source under SSE-KMS (its ETags no MD5s, ``-3`` kept) streamed
    into a plain bucket: the copy follows its parts, its ETag cannot equal the source's,
    and the size and dates decide: the second sync copies nothing, a same-size rewrite of
    the source is copied."""
    from s3_encrypting_front import EncryptingFront

    b = tensorstream_s3
    put_in_parts(b, "src/m.bin", [os.urandom(8 * MiB), os.urandom(8 * MiB), os.urandom(MiB)])
    plain = b.create_bucket()
    dst = f"s3://{plain}/dst/"
    with EncryptingFront(b.proxy.url, {"x-amz-server-side-encryption": "aws:kms"},
                         prefix=f"/{b.bucket}/src/") as front:
        options = _streamed(b, s3_endpoint=front.url)
        assert sync(b.uri("src/"), dst, options) == {"m.bin": "copied"}
        assert b.client.head_object(Bucket=plain, Key="dst/m.bin")["ETag"].endswith('-3"')
        front.writes.clear()
        assert sync(b.uri("src/"), dst, options) == {"m.bin": "skipped"}
        assert front.writes == []
        time.sleep(1.1)
        new = os.urandom(17 * MiB)
        put_in_parts(b, "src/m.bin", [new[:8 * MiB], new[8 * MiB:16 * MiB], new[16 * MiB:]])
        assert sync(b.uri("src/"), dst, options) == {"m.bin": "copied"}
    assert b.client.get_object(Bucket=plain, Key="dst/m.bin")["Body"].read() == new
