"""``cp``/``sync`` within one S3 store, the neighbours of :mod:`test_copy_server_side`:
what the summary says of bytes that never crossed this machine, a destination bucket
encrypted with SSE-KMS, an archived source, a source whose HEAD S3 rejects, a 200 whose
body is an ``<Error>``, keys that must be encoded in ``x-amz-copy-source``, objects of 0
bytes, a source gone or replaced between the listing and the copy. moto's server on
loopback behind the package's fault proxy (and a front answering as S3 does where moto
does not)."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import time
from typing import Any

import pytest

from s3_loop_front import LoopFront, pass_on, send_back
from s3_parts import put_in_parts
from tensorstream.copy.engine import copy
from tensorstream.providers.s3.metadata import MetadataOptions

MiB = 1 << 20


def test_bytes_s3_copied_are_no_throughput_of_this_machine(tensorstream_s3: Any) -> None:
    """The summary's rate (``gbps``, and the CLI's "MiB/s") divided every copied byte by
    the seconds, those S3 copied itself too: a 100 GiB copy made by S3 in 20 s was
    "5 GiB/s" through a machine that moved none of it. Those bytes are now counted apart
    (``server_side_bytes``) and left out of the rate; a streamed copy still has one."""
    b = tensorstream_s3
    b.put("src/a.bin", os.urandom(MiB))
    r = copy(b.uri("src/a.bin"), b.uri("dst/a.bin"), **b.options)
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert r.bytes == MiB and r.server_side_bytes == MiB and r.gbps == 0.0
    assert r.to_dict()["server_side_bytes"] == MiB and r.to_dict()["gbps"] == 0.0
    r = copy(b.uri("src/a.bin"), b.uri("dst/b.bin"), server_side_copy=False, **b.options)
    assert r.ok and r.server_side_bytes == 0 and r.gbps > 0, r.errors


class _Front(LoopFront):
    """A reverse proxy to moto (on a loop thread) whose :meth:`answer` may change what
    moto answered, as S3 answers where moto does not; part ETags it replaced (``real``:
    answered -> moto's) are mapped back in the requests that list them."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream
        self.real: dict[bytes, bytes] = {}

    def answer(self, request: Any, status: int, headers: dict[str, str],
               body: bytes) -> tuple[int, bytes]:
        """The status and body sent for moto's (``headers`` changed in place)."""
        return status, body

    async def _forward(self, request: Any) -> Any:
        body = await request.read()
        for fake, real in self.real.items():  # a CompleteMultipartUpload lists the parts
            body = body.replace(fake, real)
        status, out, answer, length = await pass_on(request, self.upstream, body)
        if request.method != "HEAD":
            status, answer = self.answer(request, status, out, answer)
        return await send_back(request, status, out, answer, length)


class _KMSFront(_Front):
    """A multipart copy answered as S3 does into a bucket whose default encryption is
    SSE-KMS (moto answers as if unencrypted): the encryption header on
    CreateMultipartUpload, UploadPartCopy and CompleteMultipartUpload, and each part's
    ETag 32 hex digits that are no MD5."""

    def answer(self, request: Any, status: int, headers: dict[str, str],
               body: bytes) -> tuple[int, bytes]:
        multipart = "uploads" in request.query or "uploadId" in request.query
        if multipart and status == 200 and request.method in ("PUT", "POST"):
            headers["x-amz-server-side-encryption"] = "aws:kms"
            match = re.search(rb"<ETag>(&quot;|\")?([0-9a-f]{32})", body)
            if match is not None and "x-amz-copy-source" in request.headers:
                fake = secrets.token_hex(16).encode()
                self.real[fake] = match.group(2)
                body = body.replace(match.group(2), fake)
        return status, body


def test_a_multipart_copy_into_an_sse_kms_bucket_is_kept_not_taken_for_changed(
        tensorstream_s3: Any) -> None:
    """Into a bucket whose default encryption is SSE-KMS, S3 answers UploadPartCopy with
    part ETags of 32 hex digits that are no MD5s: the parts' ETags were compared with the
    source's as if they were, so every multipart copy there failed ("the source changed
    while it was copied"). The encryption S3 names is heeded (as for one CopyObject): the
    copy is made, only its size compared, and it is not reported verified."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), b"end"]
    put_in_parts(b, "src/p.bin", parts)
    with _KMSFront(b.proxy.url) as endpoint:
        r = copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), **{**b.options, "s3_endpoint": endpoint})
    assert r.ok and r.files == 1, r.errors
    (out,) = r.outcomes
    assert out.server_side and not out.verified and out.verified_by is None
    assert b.get("dst/p.bin") == b"".join(parts)
    assert b.server.open_multipart_uploads(b.bucket) == []


@pytest.mark.parametrize("storage_class", ["GLACIER", "DEEP_ARCHIVE"])
def test_an_archived_source_is_named_not_the_destination(tensorstream_s3: Any,
                                                         storage_class: str) -> None:
    """A source in Glacier (not restored): S3 refuses the copy with a 403
    (ObjectNotInActiveTierError), and the error said "writing the destination was
    refused", sending the user to the destination's permissions. The HEAD says the
    storage class, so the error now names the source and what to do; nothing is written.
    Once restored, it is copied by S3 as any other."""
    b = tensorstream_s3
    b.client.put_object(Bucket=b.bucket, Key="src/g.bin", Body=b"g" * 100,
                        StorageClass=storage_class)
    r = copy(b.uri("src/g.bin"), b.uri("dst/g.bin"), **b.options)
    assert not r.ok and r.files == 0
    (error,) = r.errors
    assert "destination" not in error.split(": ", 1)[1], error
    assert f"the source is archived (storage class {storage_class})" in error, error
    assert "restore" in error, error
    assert not b.server.exists(b.bucket, "dst/g.bin")
    b.client.restore_object(Bucket=b.bucket, Key="src/g.bin", RestoreRequest={"Days": 1})
    r = copy(b.uri("src/g.bin"), b.uri("dst/g.bin"), **b.options)
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert b.get("dst/g.bin") == b"g" * 100


def test_a_source_whose_head_s3_rejects_is_streamed_and_the_rest_copied_by_s3(
        tensorstream_s3: Any) -> None:
    """S3 answers the HEAD of an SSE-C object read without its key with a bare 400 (no
    body: no reason). The copy failed with "S3 rejected the request (400)"; the streamed
    copy's read says why (its GET has a body), or copies it where the HEAD alone was
    refused. That object now goes the streamed way, and only it: the other objects of the
    folder are still copied by S3 (a per-object reason never turns S3's copies off)."""
    b = tensorstream_s3
    files = {f"src/{name}.bin": os.urandom(1000) for name in "abc"}
    for key, data in files.items():
        b.put(key, data)
    b.faults.raw.path_prefix = f"/{b.bucket}/src/b.bin"
    # The server copy's HEAD of the source, and botocore's once more (after it looked for
    # the bucket's region, as it does after a bare 400 to a HEAD).
    b.faults.raw.status_script = [400, 400]
    r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, **b.options)
    assert r.ok and r.files == 3, r.errors
    assert b.faults.raw.scripted == 2
    by_src = {o.src.rsplit("/", 1)[1]: o.server_side for o in r.outcomes}
    assert by_src == {"a.bin": True, "b.bin": False, "c.bin": True}, r.outcomes
    for key, data in files.items():
        assert b.get(key.replace("src/", "dst/")) == data


@pytest.mark.parametrize("key", ["a b.bin", "ü/鍵.bin", "p%20q.bin", "p%q.bin", "a+b.bin",
                                 "q?versionId=1.bin", "x#y.bin", "t~!*'().bin", "/lead.bin"])
def test_keys_that_need_encoding_in_the_copy_source(tensorstream_s3: Any, key: str) -> None:
    """``x-amz-copy-source`` is a URL-encoded ``bucket/key``: a space, ``%``, ``+``, ``?``,
    ``#`` or non-ASCII left as is names another object (``+`` a space, ``%20`` a space,
    ``?versionId=`` a version). Each is copied by S3 to the key it names, and nothing
    else is written (``/lead.bin``: a key that starts with a slash, ``s3://b//lead.bin``)."""
    b = tensorstream_s3
    data = os.urandom(1000)
    b.client.put_object(Bucket=b.bucket, Key=f"src/{key}", Body=data)
    r = copy(b.uri(f"src/{key}"), b.uri(f"dst/{key}"), wildcards=False, **b.options)
    assert r.ok and r.outcomes[0].server_side and r.verified, r.errors
    assert b.client.get_object(Bucket=b.bucket, Key=f"dst/{key}")["Body"].read() == data
    listed = b.client.list_objects_v2(Bucket=b.bucket).get("Contents", [])
    assert sorted(o["Key"] for o in listed) == sorted([f"src/{key}", f"dst/{key}"])


def test_a_key_that_needs_encoding_in_parts(tensorstream_s3: Any) -> None:
    """The same for UploadPartCopy (each part names the source) of a multipart source."""
    b = tensorstream_s3
    key = "a b+c%d?é.bin"
    parts = [os.urandom(5 * MiB), b"x"]
    put_in_parts(b, f"src/{key}", parts)
    r = copy(b.uri(f"src/{key}"), b.uri(f"dst/{key}"), wildcards=False, **b.options)
    assert r.ok and r.outcomes[0].server_side and r.verified, r.errors
    assert b.client.get_object(Bucket=b.bucket, Key=f"dst/{key}")["Body"].read() == b"".join(
        parts)


def test_an_empty_object_is_copied_by_s3(tensorstream_s3: Any) -> None:
    """0 bytes: one CopyObject (compared: the MD5 of nothing); with ``copy_cutoff=0`` too."""
    b = tensorstream_s3
    b.put("src/empty", b"")
    for cutoff, name in ((5 << 30, "a"), (0, "b")):
        r = copy(b.uri("src/empty"), b.uri(f"dst/{name}"), copy_cutoff=cutoff, **b.options)
        assert r.ok and r.outcomes[0].server_side and r.verified, r.errors
        assert b.get(f"dst/{name}") == b""


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_source_gone_or_replaced_after_the_listing(tensorstream_s3: Any,
                                                     change: str) -> None:
    """Between the listing and the copy the source is deleted (the object fails: no such
    object) or replaced (the HEAD pinned to the listed ETag fails: changed); nothing is
    written for it, and the folder's other objects are copied."""
    b = tensorstream_s3
    b.put("src/a.bin", b"a" * 10)
    b.put("src/b.bin", b"b" * 10)

    async def change_source(method: str, path: str) -> None:
        if method == "HEAD" and path == f"/{b.bucket}/src/a.bin":
            b.faults.raw.before_forward = None

            def act() -> None:
                if change == "deleted":
                    b.client.delete_object(Bucket=b.bucket, Key="src/a.bin")
                else:
                    b.put("src/a.bin", b"c" * 10)

            await asyncio.get_running_loop().run_in_executor(None, act)

    b.faults.raw.before_forward = change_source
    r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, **b.options)
    assert r.files == 1 and len(r.errors) == 1
    assert ("no such object" if change == "deleted" else "changed") in r.errors[0], r.errors
    assert not b.server.exists(b.bucket, "dst/a.bin")
    assert b.get("dst/b.bin") == b"b" * 10


class _ErrorIn200Front(_Front):
    """S3 answers a copy request ``200 OK`` at once and may end the body with an
    ``<Error>`` (it failed while copying): the first answer to a request ``hit`` picks
    (after moto applied it) is such a body."""

    def __init__(self, upstream: str, hit: Any) -> None:
        super().__init__(upstream)
        self.hit, self.answered = hit, 0

    def answer(self, request: Any, status: int, headers: dict[str, str],
               body: bytes) -> tuple[int, bytes]:
        if status == 200 and not self.answered and self.hit(request):
            self.answered += 1
            headers["Content-Type"] = "application/xml"
            return 200, (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError'
                         b"</Code><Message>We encountered an internal error. Please try "
                         b"again.</Message></Error>")
        return status, body


@pytest.mark.parametrize("request_", ["CopyObject", "UploadPartCopy",
                                      "CompleteMultipartUpload"])
def test_a_200_whose_body_is_an_error_is_no_copy(tensorstream_s3: Any, request_: str) -> None:
    """``200 OK`` with an ``<Error>`` body (S3 does this for CopyObject, UploadPartCopy and
    CompleteMultipartUpload) is a failure, never taken for a copy: the request is sent again
    (a temporary InternalError), or for a complete S3 applied, the copy holding the source's
    ETag says so; the copy is exact and compared, no upload left."""
    b = tensorstream_s3
    if request_ == "CopyObject":
        data = os.urandom(1000)
        b.put("src/m.bin", data)
    else:
        parts = [os.urandom(5 * MiB), b"end"]
        put_in_parts(b, "src/m.bin", parts)
        data = b"".join(parts)

    def hit(request: Any) -> bool:
        copying = request.method == "PUT" and "x-amz-copy-source" in request.headers
        if request_ == "CopyObject":
            return copying and "uploadId" not in request.query
        if request_ == "UploadPartCopy":
            return copying and "uploadId" in request.query
        return request.method == "POST" and "uploadId" in request.query

    with _ErrorIn200Front(b.proxy.url, hit) as endpoint:
        front = {**b.options, "s3_endpoint": endpoint}
        r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), **front)
    assert r.ok and r.outcomes[0].server_side and r.verified, r.errors
    assert b.get("dst/m.bin") == data
    assert b.server.open_multipart_uploads(b.bucket) == []
    sent = [q.method for q in b.requests if q.path.startswith(f"/{b.bucket}/dst/m.bin")
            and q.method in ("PUT", "POST")]
    assert len(sent) == {"CopyObject": 2, "UploadPartCopy": 5,
                         "CompleteMultipartUpload": 4}[request_], sent


class _KMSFrontFailingComplete(_KMSFront):
    """:class:`_KMSFront` whose first CompleteMultipartUpload, applied by moto, is
    answered ``500 InternalError``: its answer lost."""

    failed = 0

    def answer(self, request: Any, status: int, headers: dict[str, str],
               body: bytes) -> tuple[int, bytes]:
        status, body = super().answer(request, status, headers, body)
        completing = request.method == "POST" and "uploadId" in request.query
        if completing and status == 200 and not self.failed:
            self.failed += 1
            return 500, (b"<Error><Code>InternalError</Code><Message>We encountered an "
                         b"internal error.</Message></Error>")
        return status, body


def test_an_applied_complete_whose_answer_was_lost_counts_where_etags_cannot_say(
        tensorstream_s3: Any) -> None:
    """A multipart copy whose ETags cannot be compared (here: into an SSE-KMS bucket), its
    CompleteMultipartUpload applied but answered with an error: the copy was reported
    failed while S3 had published it (only a copy holding the source's ETag was looked
    for). The upload being gone (NoSuchUpload) and the object holding as many bytes in as
    many parts now say it was applied: copied, not verified, nothing left behind."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), b"end"]
    put_in_parts(b, "src/p.bin", parts)
    front = _KMSFrontFailingComplete(b.proxy.url)
    with front as endpoint:
        r = copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), **{**b.options, "s3_endpoint": endpoint})
    assert front.failed == 1
    assert r.ok and r.files == 1, r.errors
    assert r.outcomes[0].server_side and not r.outcomes[0].verified
    assert b.get("dst/p.bin") == b"".join(parts)
    assert b.server.open_multipart_uploads(b.bucket) == []


class _KMSFrontAbortedComplete(_KMSFront):
    """:class:`_KMSFront` whose first CompleteMultipartUpload is not applied: its upload
    is aborted by another (a lifecycle rule) meanwhile, and it is answered ``500``."""

    def __init__(self, upstream: str, abort: Any) -> None:
        super().__init__(upstream)
        self.abort, self.aborted = abort, 0

    async def _forward(self, request: Any) -> Any:
        if request.method == "POST" and "uploadId" in request.query and not self.aborted:
            self.aborted += 1
            bucket, _, key = request.path.lstrip("/").partition("/")
            await asyncio.to_thread(self.abort, Bucket=bucket, Key=key,
                                    UploadId=request.query["uploadId"])
            return await send_back(request, 500, {}, b"<Error><Code>InternalError</Code>"
                                   b"</Error>", None)
        return await super()._forward(request)


def test_an_older_copy_of_as_many_parts_is_not_taken_for_an_aborted_upload(
        tensorstream_s3: Any) -> None:
    """Where ETags cannot say (SSE-KMS), the upload gone and the destination holding as
    many bytes in as many parts counted as applied: an earlier copy of the same source
    there, and this copy's upload aborted by another while its complete failed, the copy
    was reported made (its metadata never applied). The object must also be written since
    the copy began, as for a write: the copy fails, saying the upload is gone."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), b"end"]
    put_in_parts(b, "src/p.bin", parts)
    opts = {**b.options, "retries": 1}
    with _KMSFront(b.proxy.url) as endpoint:
        assert copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), **{**opts, "s3_endpoint": endpoint}).ok
    time.sleep(3.1)  # (S3's Last-Modified is in whole seconds)
    front = _KMSFrontAbortedComplete(b.proxy.url, b.server.client.abort_multipart_upload)
    with front as endpoint:
        r = copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), **{**opts, "s3_endpoint": endpoint})
    assert front.aborted == 1
    assert not r.ok and "upload is gone" in r.errors[0], r.errors
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_a_complete_that_failed_while_another_object_is_there_is_a_failure(
        tensorstream_s3: Any) -> None:
    """The neighbour: the complete failed and was not applied (the destination holds an
    older object): the copy fails, the upload is aborted, the old object stays."""
    b = tensorstream_s3
    put_in_parts(b, "src/p.bin", [os.urandom(5 * MiB), b"end"])
    b.put("dst/p.bin", b"the old object")
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/p.bin"
    # The destination's CreateMultipartUpload and two parts forwarded; its complete
    # answered 500 by the proxy (not forwarded: not applied).
    b.faults.raw.status_script = [200, 200, 200, 500]
    with _KMSFront(b.proxy.url) as endpoint:
        r = copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), concurrency=1,
                 **{**b.options, "s3_endpoint": endpoint})
    assert b.faults.raw.scripted == 1
    assert not r.ok and r.files == 0 and "InternalError" in r.errors[0], r.errors
    assert b.get("dst/p.bin") == b"the old object"
    assert b.server.open_multipart_uploads(b.bucket) == []


@pytest.mark.parametrize("parts", [1, 2], ids=["CopyObject", "UploadPartCopy"])
def test_a_refused_copy_of_an_sse_kms_source_does_not_blame_only_the_destination(
        tensorstream_s3: Any, parts: int) -> None:
    """A source encrypted with SSE-KMS: its HEAD needs no KMS permission, its copy needs
    kms:Decrypt on the source's key, so S3's AccessDenied to the copy may be the source's.
    It said "writing the destination was refused (the source could be read with the same
    credentials)"; it now names both possibilities."""
    b = tensorstream_s3
    body = os.urandom(5 * MiB + 10 if parts == 2 else 1000)
    b.client.put_object(Bucket=b.bucket, Key="src/k.bin", Body=body,
                        ServerSideEncryption="aws:kms")
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    # The CopyObject refused; or the CreateMultipartUpload let through, its part refused.
    b.faults.raw.status_script = [403] if parts == 1 else [200, 403]
    r = copy(b.uri("src/k.bin"), b.uri("dst/k.bin"), copy_cutoff=5 * MiB, **b.options)
    assert not r.ok and r.files == 0
    (error,) = r.errors
    assert "the source could be read" not in error, error
    assert "kms:Decrypt" in error and "s3:PutObject" in error and "AccessDenied" in error, error
    assert not b.server.exists(b.bucket, "dst/k.bin")
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_a_complete_that_failed_over_an_older_copy_of_the_same_bytes_is_a_failure(
        tensorstream_s3: Any) -> None:
    """The complete of a copy in parts failed and was not applied, while the destination
    held an earlier copy of the same source (the ETag the parts make): that ETag counted
    as applied, the copy was reported made, its metadata never applied and its upload left
    open. The object must also be written since the copy began, as for a write: the copy
    fails, the upload is aborted, the earlier copy stays as it was."""
    b = tensorstream_s3
    put_in_parts(b, "src/p.bin", [os.urandom(5 * MiB), b"end"])
    assert copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), **b.options).ok
    # (S3's Last-Modified is in whole seconds, 2 s of slack, and the clock's skew read
    # from a HEAD's Date counts that HEAD's latency: seconds on a loaded CI machine)
    time.sleep(3.5)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/p.bin"
    b.faults.raw.status_script = [200, 200, 200, 500]  # (the complete: not forwarded)
    r = copy(b.uri("src/p.bin"), b.uri("dst/p.bin"), concurrency=1, **b.options,
             object_metadata=MetadataOptions(metadata={"new": "1"}))
    assert b.faults.raw.scripted == 1
    assert not r.ok and "InternalError" in r.errors[0], r.errors
    assert b.client.head_object(Bucket=b.bucket, Key="dst/p.bin")["Metadata"] == {}
    assert b.server.open_multipart_uploads(b.bucket) == []


class _KMSCompleteLost(_KMSFront):
    """:class:`_KMSFront` whose first CompleteMultipartUpload is answered 500: applied by
    moto first (``lost="applied"``: its answer lost), or never (``"aborted by another"``:
    the upload aborted meanwhile, as a lifecycle rule or another writer aborts it)."""

    def __init__(self, upstream: str, lost: str, client: Any, bucket: str) -> None:
        super().__init__(upstream)
        self.lost, self.client, self.bucket, self.failed = lost, client, bucket, 0

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        if (request.method == "POST" and "uploadId" in request.query and not self.failed):
            self.failed += 1
            if self.lost == "applied":
                await super()._forward(request)
            else:
                await asyncio.to_thread(
                    self.client.abort_multipart_upload, Bucket=self.bucket,
                    Key=request.path.split("/", 2)[2], UploadId=request.query["uploadId"])
            return web.Response(status=500, content_type="application/xml", body=(
                b"<Error><Code>InternalError</Code><Message>We encountered an internal "
                b"error.</Message></Error>"))
        return await super()._forward(request)


@pytest.mark.parametrize("lost", ["applied", "aborted by another"])
def test_a_kms_copy_in_parts_whose_complete_was_lost_is_judged_as_an_upload_is(
        tensorstream_s3: Any, lost: str) -> None:
    """Into SSE-KMS (no ETag is an MD5) with ``s3_checksum="when_required"`` (no checksum
    sent or kept), a copy in parts whose complete's answer was lost is judged by the rule
    an upload's is under the same settings, no weaker (docs/s3.md): the upload gone, the
    object of as many bytes in as many parts, written since the copy began. Applied, it
    is the success it was, reported not verified (only the size says so); aborted by
    another while the destination holds an older object of the same size in as many
    parts (an earlier copy), that is not taken for this copy: it fails and says why."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), b"end"]
    put_in_parts(b, "src/p.bin", parts)
    older = [os.urandom(5 * MiB), b"old"]
    if lost != "applied":
        put_in_parts(b, "dst/p.bin", older)
        time.sleep(3.1)  # (Last-Modified is in whole seconds)
    front = _KMSCompleteLost(b.proxy.url, lost, b.client, b.bucket)
    with front as endpoint:
        r = copy(b.uri("src/p.bin"), b.uri("dst/p.bin"),
                 **{**b.options, "s3_endpoint": endpoint, "s3_checksum": "when_required"})
    assert front.failed == 1
    if lost == "applied":
        assert r.ok, r.errors
        (out,) = r.outcomes
        assert out.server_side and not out.verified and out.verified_by is None
        assert b.get("dst/p.bin") == b"".join(parts)
    else:
        assert not r.ok and "aborted by another" in r.errors[0], r.errors
        assert b.get("dst/p.bin") == b"".join(older)
    assert b.server.open_multipart_uploads(b.bucket) == []
