"""``cp``/``sync`` within one S3 store: S3 copies the objects itself (CopyObject,
UploadPartCopy), no byte through this machine. moto's server on loopback behind the
package's fault proxy, which records every request; the engine in-process."""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

import pytest

from iam_users import iam_user_keys
from s3_parts import copy_cancelled_while_held, put_in_parts
from tensorstream.copy.engine import copy

MiB = 1 << 20


def _source_reads(backend: Any, key: str) -> list[Any]:
    """GETs of ``key``'s bytes that went through the proxy (this machine)."""
    path = f"/{backend.bucket}/{key}"
    return [r for r in backend.requests if r.method == "GET" and r.path == path]


def _head(backend: Any, key: str) -> dict[str, Any]:
    return dict(backend.client.head_object(Bucket=backend.bucket, Key=key))


def test_an_object_is_copied_by_s3_with_its_metadata_and_compared(tensorstream_s3: Any) -> None:
    """``cp s3://b/a s3://b/c`` on one endpoint downloaded every byte and uploaded it again;
    now one CopyObject (no GET of the source), its metadata kept as aws s3 cp keeps it, the
    copy's ETag compared with the source's (verified, and said how)."""
    b = tensorstream_s3
    data = os.urandom(3 * MiB)
    b.client.put_object(Bucket=b.bucket, Key="src/m.bin", Body=data, ContentType="x-model/w",
                        Metadata={"sha": "abc"})
    b.proxy.clear_log()
    r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), **b.options)
    assert r.ok and r.files == 1 and r.verified, r.errors
    (out,) = r.outcomes
    assert out.server_side and out.verified and out.verified_by == "ETag"
    assert b.get("dst/m.bin") == data
    head = _head(b, "dst/m.bin")
    assert head["ContentType"] == "x-model/w" and head["Metadata"] == {"sha": "abc"}
    assert _source_reads(b, "src/m.bin") == []
    assert [q.method for q in b.requests if q.path == f"/{b.bucket}/dst/m.bin"] == ["PUT", "HEAD"]


def test_a_multipart_source_is_copied_in_its_own_parts_so_its_etag_is_compared(
        tensorstream_s3: Any) -> None:
    """An object uploaded in parts gets UploadPartCopy parts of the same byte ranges, so the
    copy's ETag (MD5 of the parts' MD5s) is the source's; checked before it is published.
    Its Content-Type and metadata go with the upload; no multipart upload is left."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1000)]
    etag = put_in_parts(b, "src/big.bin", parts, ContentType="x-model/w",
                         Metadata={"k": "v"})
    b.proxy.clear_log()
    r = copy(b.uri("src/big.bin"), b.uri("dst/big.bin"), part_size=8 * MiB, **b.options)
    assert r.ok and r.verified, r.errors
    assert r.outcomes[0].server_side and r.outcomes[0].verified_by == "ETag"
    head = _head(b, "dst/big.bin")
    assert head["ETag"] == etag and head["ContentLength"] == len(b"".join(parts))
    assert head["ContentType"] == "x-model/w" and head["Metadata"] == {"k": "v"}
    assert b.get("dst/big.bin") == b"".join(parts)
    assert _source_reads(b, "src/big.bin") == []
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_an_object_in_one_piece_above_the_cutoff_goes_in_parts_and_is_not_called_verified(
        tensorstream_s3: Any) -> None:
    """``copy_cutoff`` (5 GiB, S3's largest CopyObject) lowered: an object stored in one
    piece is copied in ``part_size`` parts. Its copy's ETag (``-3``) cannot equal the
    source's MD5, so only the size was compared: the copy is not reported verified."""
    b = tensorstream_s3
    data = os.urandom(12 * MiB)
    b.put("src/one.bin", data)
    b.proxy.clear_log()
    r = copy(b.uri("src/one.bin"), b.uri("dst/one.bin"), copy_cutoff=5 * MiB,
             part_size=5 * MiB, **b.options)
    assert r.ok and r.files == 1, r.errors
    (out,) = r.outcomes
    assert out.server_side and not out.verified and out.verified_by is None
    assert not r.verified
    assert _head(b, "dst/one.bin")["ETag"].endswith('-3"')
    assert b.get("dst/one.bin") == data
    assert _source_reads(b, "src/one.bin") == []
    # The neighbour: at the cutoff itself, one CopyObject (compared).
    r = copy(b.uri("src/one.bin"), b.uri("dst/two.bin"), copy_cutoff=12 * MiB, **b.options)
    assert r.ok and r.verified and r.outcomes[0].verified_by == "ETag", r.errors
    with pytest.raises(ValueError, match="copy_cutoff"):
        copy(b.uri("src/one.bin"), b.uri("dst/x.bin"), copy_cutoff=(5 << 30) + 1, **b.options)


def test_folders_wildcards_and_sync_are_copied_on_the_server(tensorstream_s3: Any) -> None:
    """cp -r, a wildcard source and sync all copy on the server; a second sync finds
    the copies unchanged (their ETags are the sources')."""
    b = tensorstream_s3
    files = {"m/a.bin": os.urandom(1000), "m/sub/b.bin": os.urandom(2000), "m/c.txt": b"c"}
    for key, data in files.items():
        b.put(key, data)
    put_in_parts(b, "m/p.bin", [os.urandom(5 * MiB), b"tail"])
    b.proxy.clear_log()
    r = copy(b.uri("m/"), b.uri("r/"), recursive=True, **b.options)
    assert r.ok and r.files == 4 and r.verified, r.errors
    assert all(o.server_side for o in r.outcomes)
    r = copy(b.uri("m/*.bin"), b.uri("w/"), **b.options)
    assert r.ok and sorted(o.dst for o in r.outcomes) == [
        b.uri("w/a.bin"), b.uri("w/p.bin"), b.uri("w/sub/b.bin")], r.errors
    runs = []
    for _ in range(2):
        r = copy(b.uri("m/"), b.uri("s/"), recursive=True, skip_unchanged=True, **b.options)
        assert r.ok, r.errors
        runs.append(sorted((o.status, o.server_side) for o in r.outcomes))
    assert runs == [[("copied", True)] * 4, [("skipped", False)] * 4]
    for key, data in files.items():
        assert b.get(key.replace("m/", "s/", 1)) == data
    # (no byte read here: the GETs are the tags of the copies in parts, ?tagging)
    assert not [q for q in b.requests if q.method == "GET" and "/m/" in q.path
                and not q.path.endswith("?tagging")]


def test_no_server_side_copy_streams_the_bytes(tensorstream_s3: Any) -> None:
    """``server_side_copy=False`` (``--no-server-side-copy``): the copy goes through this
    machine as before (the source is read)."""
    b = tensorstream_s3
    data = os.urandom(1000)
    b.put("src/m.bin", data)
    b.proxy.clear_log()
    r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), server_side_copy=False, **b.options)
    assert r.ok and r.verified and not r.outcomes[0].server_side, r.errors
    assert _source_reads(b, "src/m.bin")
    assert b.get("dst/m.bin") == data


@pytest.mark.parametrize("how", ["one CopyObject", "in parts"])
def test_a_source_replaced_mid_copy_is_an_error_never_a_mixed_object(
        tensorstream_s3: Any, how: str) -> None:
    """The source replaced while S3 copies it (moto ignores x-amz-copy-source-if-match,
    which real S3 answers with 412): in parts, the parts' ETags do not make the source's,
    the upload is aborted and the old destination stays; in one CopyObject, the copy's ETag
    is not the source's and the copy is removed. Either way the copy fails, saying why."""
    b = tensorstream_s3
    dst_key = f"dst/{secrets.token_hex(4)}.bin"
    if how == "in parts":
        put_in_parts(b, "src/m.bin", [os.urandom(5 * MiB), os.urandom(5 * MiB), b"end"])
        b.put(dst_key, b"the old object")
    else:
        b.put("src/m.bin", os.urandom(1000))
    puts = []

    async def replace_source(method: str, path: str) -> None:
        if method == "PUT" and path == f"/{b.bucket}/{dst_key}":
            puts.append(path)
            if len(puts) == (2 if how == "in parts" else 1):
                import asyncio
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: b.put("src/m.bin", os.urandom(5 * MiB + 1)))

    b.faults.raw.before_forward = replace_source
    r = copy(b.uri("src/m.bin"), b.uri(dst_key), concurrency=1, **b.options)
    assert not r.ok and r.files == 0
    assert "changed" in r.errors[0], r.errors
    if how == "in parts":
        assert b.get(dst_key) == b"the old object"
        assert b.server.open_multipart_uploads(b.bucket) == []
    else:
        assert not b.server.exists(b.bucket, dst_key)


def test_a_copy_object_that_failed_its_check_in_a_versioned_bucket_removes_its_version(
        tensorstream_s3: Any) -> None:
    """The neighbour in a versioned bucket: the one CopyObject whose ETag is not the
    source's (the source replaced as S3 copied it) was removed by key, and the delete
    marker hid the object the destination held before. The version the copy wrote is
    removed now: the old object is the key's again, and no delete marker is left."""
    b = tensorstream_s3
    b.client.put_bucket_versioning(Bucket=b.bucket,
                                   VersioningConfiguration={"Status": "Enabled"})
    dst_key = f"dst/{secrets.token_hex(4)}.bin"
    b.put("src/m.bin", os.urandom(1000))
    b.put(dst_key, b"the old object")

    async def replace_source(method: str, path: str) -> None:
        if method == "PUT" and path == f"/{b.bucket}/{dst_key}":
            import asyncio
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: b.put("src/m.bin", os.urandom(2000)))

    b.faults.raw.before_forward = replace_source
    r = copy(b.uri("src/m.bin"), b.uri(dst_key), concurrency=1, **b.options)
    assert not r.ok and "changed" in r.errors[0] and "removed" in r.errors[0], r.errors
    assert b.get(dst_key) == b"the old object"
    listed = b.client.list_object_versions(Bucket=b.bucket, Prefix=dst_key)
    assert listed.get("DeleteMarkers", []) == []
    assert [v["Size"] for v in listed.get("Versions", [])] == [len(b"the old object")]


def _user(server: Any, bucket: str, deny: str, prefix: str) -> dict[str, Any]:
    """Options with the keys of a new IAM user allowed everything but ``deny`` (an S3
    action) on ``prefix`` of ``bucket``."""
    return iam_user_keys(server, "u", [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": deny, "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"}])


@pytest.mark.parametrize("side", ["source", "destination"])
def test_access_denied_names_the_side_it_is_about(tensorstream_s3: Any, side: str) -> None:
    """A key that may not read the source, or not write the destination: the error says
    which (S3 answers a refused copy with a bare AccessDenied); nothing is left behind.
    moto checks neither for a HEAD or a copy (only for GET and PutObject), so the proxy
    answers as S3 does: 403 to the source's HEAD (no body), AccessDenied to the copy."""
    b = tensorstream_s3
    b.put("src/a.bin", os.urandom(1000))
    b.faults.raw.path_prefix = f"/{b.bucket}/{'src/a.bin' if side == 'source' else 'dst/'}"
    b.faults.raw.status_script = [403]
    r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, **b.options)
    assert not r.ok and r.files == 0
    said = "reading the source was refused" if side == "source" else (
        "writing the destination was refused")
    assert said in r.errors[0] and "S3 refused the request" in r.errors[0], r.errors
    assert not b.server.exists(b.bucket, "dst/a.bin")
    assert b.server.open_multipart_uploads(b.bucket) == []
    if side == "destination":
        assert "AccessDenied" in r.errors[0]


def test_a_server_without_copies_gets_the_streamed_copy(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A store that answers 501 NotImplemented to a copy request: the object is copied
    through this machine instead (one log line), not failed, and later objects go
    straight to the streamed copy."""
    b = tensorstream_s3
    files = {"src/a.bin": os.urandom(1000), "src/b.bin": os.urandom(2000)}
    for key, data in files.items():
        b.put(key, data)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    b.faults.raw.status_script = [501]  # the first request to dst/: the copy
    with caplog.at_level(logging.WARNING, logger="tensorstream.copy"):
        r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, **b.options)
    assert r.ok and r.files == 2 and r.verified, r.errors
    assert not any(o.server_side for o in r.outcomes)
    lines = [rec for rec in caplog.records if "through this machine" in rec.getMessage()]
    assert len(lines) == 1, caplog.records
    for key, data in files.items():
        assert b.get(key.replace("src/", "dst/")) == data


def test_another_key_pair_per_side_streams_the_copy(tensorstream_s3: Any) -> None:
    """One endpoint, another key pair for the destination: a copy request would read the
    source with the destination's key, which may not read it; streamed, as before."""
    b = tensorstream_s3
    b.put("src/a.bin", b"a")
    keys = _user(b.server, b.bucket, "s3:DeleteBucket", "nothing/")
    r = copy(b.uri("src/a.bin"), b.uri("dst/a.bin"), src_options=b.options,
             dst_options={**b.options, **keys})
    assert r.ok and not r.outcomes[0].server_side, r.errors
    assert b.get("dst/a.bin") == b"a"


def test_a_copy_that_takes_longer_than_the_idle_timeout_is_not_cut(
        tensorstream_s3: Any) -> None:
    """S3 answers a long copy (seconds per GiB) with its status at once and whitespace while
    it copies: bytes arrive, slowly, for longer than ``timeout_idle``. The copy requests ran
    under the policy layer's idle watchdog, which only hears of bytes a read reports, so a
    large CopyObject was cut as "idle" (and retried, and cut again). Here the answers trickle
    in at 100 B/s for ~2.5 s with ``timeout_idle=1``: botocore's own read timeout (bytes
    within 1 s) is what applies."""
    b = tensorstream_s3
    data = os.urandom(1000)
    b.put("src/slow.bin", data)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    b.faults.raw.rate_limit = 100
    r = copy(b.uri("src/slow.bin"), b.uri("dst/slow.bin"), **{**b.options, "timeout_idle": 1})
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert b.get("dst/slow.bin") == data


def test_a_copy_request_answered_503_is_sent_again(tensorstream_s3: Any) -> None:
    """SlowDown (503) on a copy request is temporary: sent again under the retry policy
    (the neighbour of 501, which is not retried but streamed)."""
    b = tensorstream_s3
    b.put("src/a.bin", b"a" * 100)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    b.faults.raw.status_script = [503]
    r = copy(b.uri("src/a.bin"), b.uri("dst/a.bin"), **b.options)
    assert r.ok and r.outcomes[0].server_side and r.verified, r.errors
    assert b.faults.raw.scripted == 1
    assert [q.status for q in b.requests if q.path == f"/{b.bucket}/dst/a.bin"] == [
        503, 200, 200]  # the copy, again, and the HEAD of the copy


def test_a_completed_copy_whose_answer_was_lost_is_a_copy(tensorstream_s3: Any) -> None:
    """CompleteMultipartUpload applied, its answer cut: it is sent once (as the writer sends
    it), and the copy was reported failed ("cannot reach") while it was published. The
    destination holding the source's ETag says the complete was applied: one copy,
    compared, no upload left behind."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), b"end"]
    put_in_parts(b, "src/m.bin", parts)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    # moto's answers: UploadPartCopy 220 bytes, CreateMultipartUpload 280, Complete 323
    b.faults.raw.drop_after = 300
    b.faults.raw.drop_times = 1
    r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), **b.options)
    assert b.faults.raw.dropped == 1
    assert r.ok and r.outcomes[0].verified_by == "ETag", r.errors
    assert b.get("dst/m.bin") == b"".join(parts)
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_a_multipart_copy_cancelled_midway_is_aborted(tensorstream_s3: Any) -> None:
    """Ctrl-C (the copy's task cancelled) while S3 copies the parts: the multipart upload
    is aborted (shielded from the cancellation), nothing is published, the outcome says
    interrupted."""
    b = tensorstream_s3
    put_in_parts(b, "src/m.bin", [os.urandom(5 * MiB), os.urandom(5 * MiB), b"end"])
    result = copy_cancelled_while_held(b, b.uri("src/m.bin"), "dst/m.bin", "PUT")
    assert [o.status for o in result.outcomes] == ["interrupted"]
    assert b.server.open_multipart_uploads(b.bucket) == []
    assert not b.server.exists(b.bucket, "dst/m.bin")


def test_an_sse_kms_source_is_one_copy_object_not_called_verified(tensorstream_s3: Any) -> None:
    """Under SSE-KMS an ETag is no MD5: the object still gets one CopyObject (it went in
    parts of the copy's own layout), and only its size could be compared, so it is not
    reported verified (its line says so)."""
    b = tensorstream_s3
    data = os.urandom(1000)
    b.client.put_object(Bucket=b.bucket, Key="src/k.bin", Body=data, ServerSideEncryption="aws:kms")
    b.proxy.clear_log()
    r = copy(b.uri("src/k.bin"), b.uri("dst/k.bin"), **b.options)
    assert r.ok and r.files == 1 and not r.verified, r.errors
    assert r.outcomes[0].server_side and r.outcomes[0].verified_by is None
    assert [q.method for q in b.requests if q.path == f"/{b.bucket}/dst/k.bin"] == ["PUT", "HEAD"]
    assert b.get("dst/k.bin") == data


def test_s3s_precondition_failed_on_the_copy_source_is_a_changed_source(
        tensorstream_s3: Any) -> None:
    """Real S3 answers a copy whose source no longer has the listed ETag with 412
    PreconditionFailed (moto ignores x-amz-copy-source-if-match; the proxy answers as S3
    does): the object fails as changed, not retried, nothing written."""
    b = tensorstream_s3
    b.put("src/a.bin", b"a" * 100)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    b.faults.raw.status_script = [412]
    r = copy(b.uri("src/a.bin"), b.uri("dst/a.bin"), **b.options)
    assert not r.ok and "changed" in r.errors[0] and "PreconditionFailed" in r.errors[0], r.errors
    assert [q.status for q in b.requests if q.path == f"/{b.bucket}/dst/a.bin"] == [412]
    assert not b.server.exists(b.bucket, "dst/a.bin")


def test_a_copy_into_another_bucket_of_the_store_is_copied_by_s3(moto_s3: Any) -> None:
    """``cp s3://a/k s3://b/k`` (and ``-r``) on one endpoint streamed every byte through
    this machine: two buckets were taken for two stores. Now S3 copies them; the
    neighbours, one object onto itself and a prefix into one under it, are still refused
    only within one bucket."""
    other = f"other-{secrets.token_hex(4)}"
    moto_s3.create_bucket(other)
    data = os.urandom(1000)
    moto_s3.put("tensorstream-tests", "xb/m.bin", data)
    moto_s3.put("tensorstream-tests", "xb/sub/n.bin", b"n")
    r = copy("s3://tensorstream-tests/xb/m.bin", f"s3://{other}/xb/m.bin", **moto_s3.options())
    assert r.ok and r.outcomes[0].server_side and r.verified, r.errors
    assert moto_s3.get(other, "xb/m.bin") == data
    r = copy("s3://tensorstream-tests/xb/", f"s3://{other}/xb/", recursive=True,
             **moto_s3.options())
    assert r.ok and r.files == 2 and all(o.server_side for o in r.outcomes), r.errors
    assert moto_s3.get(other, "xb/sub/n.bin") == b"n"


def test_a_multipart_copy_whose_abort_fails_says_the_upload_is_left(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A failed copy in parts whose abort S3 does not take (here: every abort's connection
    cut): the upload was left without a word (a streamed upload's writer warned). Now the
    same warning names the upload left for a lifecycle rule, as the writer's does."""
    b = tensorstream_s3
    dst_key = f"dst/{secrets.token_hex(4)}.bin"
    put_in_parts(b, "src/m.bin", [os.urandom(5 * MiB), os.urandom(5 * MiB), b"end"])
    puts = []

    async def replace_source_and_cut_aborts(method: str, path: str) -> None:
        if method == "DELETE" and path == f"/{b.bucket}/{dst_key}":
            raise ConnectionError("abort cut")
        if method == "PUT" and path == f"/{b.bucket}/{dst_key}":
            puts.append(path)
            if len(puts) == 2:
                import asyncio
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: b.put("src/m.bin", os.urandom(5 * MiB + 1)))

    b.faults.raw.before_forward = replace_source_and_cut_aborts
    caplog.set_level(logging.WARNING, logger="tensorstream")
    r = copy(b.uri("src/m.bin"), b.uri(dst_key), concurrency=1, **b.options)
    assert not r.ok and "changed" in r.errors[0], r.errors
    b.faults.raw.before_forward = None
    left = [u["UploadId"] for u in b.server.client.list_multipart_uploads(
        Bucket=b.bucket, Prefix=dst_key).get("Uploads", [])]
    assert len(left) == 1
    said = [m for m in caplog.messages if "could not abort multipart upload" in m]
    assert len(said) == 1 and left[0] in said[0] and "lifecycle rule" in said[0], caplog.messages
    b.server.client.abort_multipart_upload(Bucket=b.bucket, Key=dst_key, UploadId=left[0])
