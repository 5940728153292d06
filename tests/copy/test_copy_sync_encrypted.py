"""``sync`` into (and out of) S3 objects whose ETags are no MD5 of their bytes (SSE-KMS,
DSSE-KMS, SSE-C): a second run copies nothing, a real change is still copied. moto's
server behind the package's fault proxy, and a front answering ETags as S3 does under
those encryptions (:mod:`s3_encrypting_front`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from s3_encrypting_front import EncryptingFront
from s3_parts import put_in_parts
from sync_runs import local_folder, sync

MiB = 1 << 20
ENCRYPTIONS = [
    {"x-amz-server-side-encryption": "aws:kms"},
    {"x-amz-server-side-encryption": "aws:kms:dsse"},
    {"x-amz-server-side-encryption-customer-algorithm": "AES256"},
]
IDS = ["SSE-KMS", "DSSE-KMS", "SSE-C"]


def _put_sources(b: Any) -> None:
    """``src/one.bin`` (stored in one piece) and ``src/parts.bin`` (uploaded in parts)."""
    b.put("src/one.bin", os.urandom(1000))
    put_in_parts(b, "src/parts.bin", [os.urandom(5 * MiB), os.urandom(1000)])


def _copy_then_skip(b: Any, dst: str, options: dict[str, Any]) -> None:
    """A first sync of ``src/`` to ``dst`` copies both sources, a second (its requests
    alone in the fault proxy's log) skips both."""
    assert sync(b.uri("src/"), dst, options) == {"one.bin": "copied", "parts.bin": "copied"}
    b.proxy.clear_log()
    assert sync(b.uri("src/"), dst, options) == {"one.bin": "skipped", "parts.bin": "skipped"}


def _change_one(b: Any, dst: str, options: dict[str, Any]) -> bytes:
    """``src/one.bin`` rewritten with other bytes of its size a second later (S3's dates
    are whole seconds): the next sync copies it alone. Its new bytes."""
    time.sleep(1.1)
    new = os.urandom(1000)
    b.put("src/one.bin", new)
    assert sync(b.uri("src/"), dst, options) == {"one.bin": "copied", "parts.bin": "skipped"}
    return new


# The front maps the ETags a request names back to moto's, which a signature checked would
# refuse: moto checks none here.
@pytest.mark.tensorstream_s3(auth=False)
@pytest.mark.parametrize(("headers", "encrypted"), [
    *((h, side) for h in ENCRYPTIONS[:2] for side in ("dst", "src", "both")),
    # S3 writes an SSE-C object only with the customer's key in the request, which no copy
    # by S3 here sends: only a source can be one (it is then streamed, and read back).
    (ENCRYPTIONS[2], "src"),
], ids=[*(f"{i}-{side}" for i in IDS[:2] for side in ("dst", "src", "both")), "SSE-C-src"])
def test_a_second_sync_within_one_store_copies_nothing(
        tensorstream_s3: Any, headers: dict[str, str], encrypted: str) -> None:
    """S3 to S3 with either side's objects under an encryption whose ETag is no MD5: the
    ETags never matched, so every sync copied every object again (by S3, each one a
    CopyObject or a multipart copy). Such ETags now say nothing and, as for ``aws s3
    sync``, the size and dates decide: the second run copies nothing, a changed source
    (same size) is copied."""
    b = tensorstream_s3
    _put_sources(b)
    prefix = {"dst": f"/{b.bucket}/dst/", "src": f"/{b.bucket}/src/", "both": "/"}[encrypted]
    with EncryptingFront(b.proxy.url, headers, prefix=prefix) as front:
        options = {**b.options, "s3_endpoint": front.url}
        first = sync(b.uri("src/"), b.uri("dst/"), options)
        assert first == {"one.bin": "copied", "parts.bin": "copied"}
        front.writes.clear()
        assert sync(b.uri("src/"), b.uri("dst/"), options) == {
            "one.bin": "skipped", "parts.bin": "skipped"}
        assert front.writes == []
        new = _change_one(b, b.uri("dst/"), options)
    assert b.get("dst/one.bin") == new


@pytest.mark.tensorstream_s3(auth=False)
@pytest.mark.parametrize("headers", ENCRYPTIONS, ids=IDS)
def test_a_second_sync_from_local_files_copies_nothing(
        tensorstream_s3: Any, headers: dict[str, str], tmp_path: Path) -> None:
    """A local folder into an encrypted bucket: the dates decide (a local file has no
    ETag), so the second run copies nothing and a change is copied."""
    b = tensorstream_s3
    src = local_folder(tmp_path, {"one.bin": os.urandom(1000), "big.bin": os.urandom(6 * MiB)})
    for f in src.iterdir():  # S3's dates are whole seconds: a file written in the second
        os.utime(f, (time.time() - 60,) * 2)  # of its upload looks newer than its copy
    with EncryptingFront(b.proxy.url, headers) as front:
        options = {**b.options, "s3_endpoint": front.url, "part_size": 5 * MiB}
        assert sync(str(src), b.uri("dst/"), options) == {"one.bin": "copied",
                                                           "big.bin": "copied"}
        front.writes.clear()
        assert sync(str(src), b.uri("dst/"), options) == {"one.bin": "skipped",
                                                           "big.bin": "skipped"}
        assert front.writes == []
        time.sleep(1.1)
        new = os.urandom(1000)
        (src / "one.bin").write_bytes(new)
        assert sync(str(src), b.uri("dst/"), options) == {"one.bin": "copied",
                                                           "big.bin": "skipped"}
    assert b.get("dst/one.bin") == new


def test_the_etags_still_decide_where_no_side_is_known_encrypted() -> None:
    """The rule itself: equal ETags are a copy; MD5s of one layout that differ are a
    change whatever the dates, unless a HEAD named SSE-KMS/DSSE/SSE-C on either side (the
    dates decide then); a listed source (encryption unknown) is HEADed only when its ETag
    alone would call the copy changed."""
    from tensorstream.copy.select import source_encryption_decides, unchanged
    from tensorstream.providers.base import ObjectInfo

    def info(etag: str, mtime: float, encrypted: bool | None = None) -> ObjectInfo:
        extra = {} if encrypted is None else {"etag_not_md5": encrypted}
        return ObjectInfo(path="k", size=10, etag=etag, mtime=mtime, extra=extra)

    a, b = '"' + "a" * 32 + '"', '"' + "b" * 32 + '"'
    assert unchanged(info(a, 2), info(a, 1, False), same_kind=True)
    assert not unchanged(info(a, 1, False), info(b, 2, False), same_kind=True)
    for src_enc, dst_enc in ((True, False), (False, True), (None, True), (True, None)):
        assert unchanged(info(a, 1, src_enc), info(b, 2, dst_enc), same_kind=True)
        assert not unchanged(info(a, 2, src_enc), info(b, 1, dst_enc), same_kind=True)
    assert source_encryption_decides(info(a, 1), info(b, 2, False), same_kind=True)
    assert not source_encryption_decides(info(a, 1), info(a, 2, False), same_kind=True)
    assert not source_encryption_decides(info(a, 1), info(b, 2, True), same_kind=True)
    assert not source_encryption_decides(info(a, 1, False), info(b, 2, False), same_kind=True)
    assert not source_encryption_decides(info(a, 1), info(b, 2, False), same_kind=False)


def test_an_unencrypted_sync_heads_no_source(tensorstream_s3: Any) -> None:
    """Without encryption the ETags decide as before: a second run sends one HEAD per
    destination object and none to a source; a same-size change is copied (its source
    HEADed once, to learn that its ETag is an MD5)."""
    b = tensorstream_s3
    b.put("src/one.bin", os.urandom(1000))
    b.put("src/two.bin", os.urandom(1000))
    assert sync(b.uri("src/"), b.uri("dst/"), b.options) == {"one.bin": "copied",
                                                              "two.bin": "copied"}
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), b.options) == {"one.bin": "skipped",
                                                              "two.bin": "skipped"}
    assert sorted(q.path for q in b.requests if q.method == "HEAD") == [
        f"/{b.bucket}/dst/one.bin", f"/{b.bucket}/dst/two.bin"]
    b.put("src/two.bin", os.urandom(1000))
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), b.options) == {"one.bin": "skipped",
                                                              "two.bin": "copied"}
    assert f"/{b.bucket}/src/two.bin" in [q.path for q in b.requests if q.method == "HEAD"]


def _source_heads(b: Any) -> list[str]:
    return [q.path for q in b.requests if q.method == "HEAD" and "/src/" in q.path]


def _encrypt_by_default(b: Any, algorithm: str) -> None:
    b.server.client.put_bucket_encryption(Bucket=b.bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": algorithm}}]})


@pytest.mark.tensorstream_s3(auth=False)
@pytest.mark.parametrize("headers", ENCRYPTIONS[:2], ids=IDS[:2])
def test_a_sync_from_a_bucket_encrypted_by_default_heads_no_source(
        tensorstream_s3: Any, headers: dict[str, str]) -> None:
    """Sources in a bucket whose default encryption is SSE-KMS (DSSE-KMS), a plain
    destination: every sync sent a HEAD per source object (its listed ETag differs from its
    copy's, and only a HEAD said whether it is an MD5). The bucket's default encryption,
    asked once, says it for the listing's objects: the dates decide, as they did once the
    HEAD named the encryption, and no source is HEADed; a changed source is copied."""
    b = tensorstream_s3
    _encrypt_by_default(b, headers["x-amz-server-side-encryption"])
    _put_sources(b)
    plain = b.create_bucket()
    with EncryptingFront(b.proxy.url, headers, prefix=f"/{b.bucket}/src/") as front:
        options = {**b.options, "s3_endpoint": front.url}
        dst = f"s3://{plain}/dst/"
        _copy_then_skip(b, dst, options)
        assert _source_heads(b) == []
        assert len([q for q in b.requests if q.path.endswith("?encryption")]) == 1
        new = _change_one(b, dst, options)
    assert b.server.client.get_object(Bucket=plain, Key="dst/one.bin")["Body"].read() == new


def test_without_a_kms_default_a_copy_rewritten_since_is_still_told_by_its_etag(
        tensorstream_s3: Any) -> None:
    """The neighbour: a bucket encrypted by default with SSE-S3 (ETags are MD5s) keeps the
    HEAD of a source whose ETag differs from its copy's: a copy rewritten since with other
    bytes of the same size (newer than its source) is copied again."""
    b = tensorstream_s3
    _encrypt_by_default(b, "AES256")
    b.put("src/one.bin", os.urandom(1000))
    assert sync(b.uri("src/"), b.uri("dst/"), b.options) == {"one.bin": "copied"}
    b.put("dst/one.bin", os.urandom(1000))
    b.proxy.clear_log()
    assert sync(b.uri("src/"), b.uri("dst/"), b.options) == {"one.bin": "copied"}
    assert f"/{b.bucket}/src/one.bin" in _source_heads(b)


@pytest.mark.tensorstream_s3(auth=False)
@pytest.mark.parametrize("refusal", [403, 501], ids=["AccessDenied", "NotImplemented"])
def test_a_refused_get_bucket_encryption_falls_back_to_a_head_per_source(
        tensorstream_s3: Any, refusal: int) -> None:
    """Credentials that may not ask a bucket's default encryption (403), or a store that
    does not answer it (501): sync asks once a run, takes the refusal as "no default", and
    a source whose ETag differs from its copy's is HEADed (none is, with the default
    known). The second run still copies nothing, a changed source is still copied."""
    b = tensorstream_s3
    _encrypt_by_default(b, "aws:kms")
    _put_sources(b)
    plain = b.create_bucket()
    b.faults.raw.query = "encryption"
    b.faults.raw.status_script = [refusal] * 20
    with EncryptingFront(b.proxy.url, {"x-amz-server-side-encryption": "aws:kms"},
                         prefix=f"/{b.bucket}/src/") as front:
        options = {**b.options, "s3_endpoint": front.url}
        dst = f"s3://{plain}/dst/"
        _copy_then_skip(b, dst, options)
        asked = [q.status for q in b.requests if q.path.endswith("?encryption")]
        assert asked == [refusal]  # once a run, refused
        # (parts.bin's copy kept its part layout, hence its ETag: nothing to HEAD for it)
        assert _source_heads(b) == [f"/{b.bucket}/src/one.bin"]
        new = _change_one(b, dst, options)
    assert b.server.client.get_object(Bucket=plain, Key="dst/one.bin")["Body"].read() == new
