"""S3 faults injected by a small reverse proxy in front of moto: a body cut
mid-way is resumed, a 200 whose body is an ``<Error>`` on complete fails the
write and aborts the upload, a complete whose answer is still on its way
when the writer is aborted is removed again, and one S3 applied whose answer
was lost (a 5xx, a timeout) is the success it was, and so is such a PutObject."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

import tensorstream
from fixtures_s3 import S3_BUCKET
from s3_encrypting_front import EncryptingFront
from tensorstream import errors
from tensorstream.copy.engine import copy_async
from tensorstream.copy.result import CopyResult
from tensorstream.providers.s3.writer import MIN_PART_SIZE
from tensorstream.testing.s3_server import MotoS3Server

MiB = 1 << 20
_HOP = {"transfer-encoding", "connection", "keep-alive", "content-length", "content-encoding"}



class Proxy:
    """Forwards every request to moto unchanged (signatures stay valid) unless
    ``fault`` returns a response of its own or asks to cut the body."""

    def __init__(self, upstream: str, moto: MotoS3Server) -> None:
        self.upstream, self.moto = upstream, moto
        self.cut_gets_after: int | None = None  # cut this many GET bodies...
        self.cut_at = 0  # ...after this many bytes
        self.error_on_complete = False
        #: Set: the answer to a CompleteMultipartUpload (which moto has carried
        #: out) waits for it; ``complete_done`` is set meanwhile.
        self.hold_complete_answer: asyncio.Event | None = None
        self.complete_done = asyncio.Event()
        #: ... and so does the answer to a PutObject of this path.
        self.match_put: str | None = None
        #: Set: a CompleteMultipartUpload is carried out by moto, and its answer
        #: lost: replaced by this status, or (0) never sent (the client times out).
        self.lose_complete_answer: int | None = None
        #: ... only the first one's; a resend is then answered NoSuchUpload, as S3 answers
        #: one of an upload completed (moto answers 200 again).
        self.lose_once = False
        #: Set: a CompleteMultipartUpload is answered 500, and carried out by moto
        #: only when the writer aborts the upload (after it looked at the object).
        self.complete_late = False
        self.held_complete: tuple[str, dict[str, str], bytes] | None = None
        #: Set: a CompleteMultipartUpload is not forwarded; its upload is aborted at
        #: moto instead (another's abort: a lifecycle rule) and the client gets a 500.
        self.abort_on_complete = False
        #: ... and then another writer stores these bytes at the key in 5 MiB parts,
        #: with CRC32 checksums or none (``replace_checksum``).
        self.replace_on_abort: bytes | None = None
        self.replace_checksum: str | None = None
        #: Set: a PutObject of ``match_put`` is answered 500 and not forwarded (not applied).
        self.refuse_put = False
        #: Set: a PutObjectTagging is answered 403 (no s3:PutObjectTagging).
        self.refuse_tagging = False
        self.seen: list[str] = []

    def _another_writer(self, bucket: str, key: str, data: bytes) -> None:
        client = self.moto.client
        crc = {"ChecksumAlgorithm": self.replace_checksum} if self.replace_checksum else {}
        upload = client.create_multipart_upload(Bucket=bucket, Key=key, **crc)["UploadId"]
        parts = []
        for n, at in enumerate(range(0, len(data), 5 * MiB), 1):
            got = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n,
                                     Body=data[at:at + 5 * MiB], **crc)
            parts.append({"PartNumber": n, "ETag": got["ETag"],
                          **({"ChecksumCRC32": got["ChecksumCRC32"]} if crc else {})})
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload,
                                         MultipartUpload={"Parts": parts})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(f"{request.method} {request.path_qs}")
        if self.error_on_complete and request.method == "POST" and "uploadId=" in request.query_string:
            return web.Response(
                status=200, content_type="application/xml",
                text="<?xml version='1.0'?><Error><Code>InternalError</Code>"
                     "<Message>We encountered an internal error.</Message></Error>",
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        is_complete = request.method == "POST" and "uploadId=" in request.query_string
        if self.refuse_tagging and request.method == "PUT" and "tagging" in request.query:
            return web.Response(status=403, content_type="application/xml",
                                text="<Error><Code>AccessDenied</Code></Error>")
        if self.refuse_put and request.method == "PUT" and request.path == self.match_put:
            return web.Response(status=500, content_type="application/xml",
                                text="<Error><Code>InternalError</Code></Error>")
        if self.lose_once and self.lose_complete_answer is None and is_complete:
            return web.Response(status=404, content_type="application/xml",
                                text="<Error><Code>NoSuchUpload</Code><Message>The specified "
                                     "upload does not exist.</Message></Error>")
        if self.complete_late and is_complete:
            # Answered 500 now; moto gets it just before the writer's abort.
            self.held_complete = (request.raw_path, headers, body)
            return web.Response(status=500, content_type="application/xml",
                                text="<Error><Code>InternalError</Code></Error>")
        if self.abort_on_complete and is_complete:
            self.abort_on_complete = False  # (once: a resend reaches moto, NoSuchUpload)
            bucket, _, key = request.path.lstrip("/").partition("/")
            await asyncio.to_thread(self.moto.client.abort_multipart_upload, Bucket=bucket,
                                    Key=key, UploadId=request.query["uploadId"])
            if self.replace_on_abort is not None:
                await asyncio.to_thread(self._another_writer, bucket, key, self.replace_on_abort)
            return web.Response(status=500, content_type="application/xml",
                                text="<Error><Code>InternalError</Code></Error>")
        if self.held_complete is not None and request.method == "DELETE" \
                and "uploadId=" in request.query_string:
            raw_path, held_headers, held_body = self.held_complete
            self.held_complete = None
            async with aiohttp.ClientSession(auto_decompress=False) as session, session.request(
                    "POST", URL(self.upstream + raw_path, encoded=True), headers=held_headers,
                    data=held_body) as late:
                assert late.status == 200, await late.text()
        async with aiohttp.ClientSession(auto_decompress=False) as session, session.request(
            # raw_path: the query as signed (path_qs re-encodes it: SignatureDoesNotMatch)
            request.method, URL(self.upstream + request.raw_path, encoded=True), headers=headers,
            data=body,
            allow_redirects=False,
        ) as up:
            payload = await up.read()
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
        publishes = (request.method == "POST" and "uploadId=" in request.query_string) or (
            request.method == "PUT" and request.path == self.match_put)
        if self.lose_complete_answer is not None and publishes:
            status = self.lose_complete_answer
            if self.lose_once:
                self.lose_complete_answer = None
            if not status:
                await asyncio.sleep(3600)
            return web.Response(status=status, content_type="application/xml",
                                text="<Error><Code>InternalError</Code><Message>lost"
                                     "</Message></Error>")
        if self.hold_complete_answer is not None and publishes:
            self.complete_done.set()
            await self.hold_complete_answer.wait()
        if request.method == "GET" and self.cut_gets_after and up.status == 206:
            self.cut_gets_after -= 1
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[: self.cut_at])
            assert request.transport is not None
            request.transport.close()  # the connection drops mid-body
            return resp
        if request.method == "HEAD":  # (its Content-Length kept: the object's size)
            head = web.StreamResponse(status=up.status, headers=out_headers)
            head.content_length = up.content_length
            await head.prepare(request)
            return head
        return web.Response(status=up.status, headers=out_headers, body=payload)


@pytest.fixture
async def proxy(moto_s3: MotoS3Server, isolated_env: Path) -> AsyncIterator[tuple[Proxy, str]]:
    p = Proxy(moto_s3.endpoint_url, moto_s3)
    app = web.Application(client_max_size=64 * MiB)
    app.router.add_route("*", "/{tail:.*}", p.handle)
    # A handler that holds a lost answer sleeps for ever: cleanup cancels it after a
    # second, not after aiohttp's default 60 s (a minute per such test).
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield p, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_body_cut_midway_is_resumed_exactly(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    p, endpoint = proxy
    key = f"faults/cut-{uuid.uuid4().hex[:8]}"
    data = os.urandom(3 * MiB)
    moto_s3.put(S3_BUCKET, key, data)
    p.cut_gets_after, p.cut_at = 2, 100_000
    opts = moto_s3.options(s3_endpoint=endpoint, backoff_initial=0.01)
    provider = tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts)
    async with provider:
        got = await provider.read_range(f"{S3_BUCKET}/{key}", 10, len(data))
        assert got == data[10:]
        assert provider.metrics.resumed_bytes == 2 * 100_000
    # the resumed requests started where the cut ones stopped, pinned to nothing else
    assert sum("GET" in s for s in p.seen) == 3


async def test_body_cut_on_every_attempt_is_an_error(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    p, endpoint = proxy
    key = f"faults/cut-always-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, key, os.urandom(1 * MiB))
    p.cut_gets_after, p.cut_at = 100, 1000
    opts = moto_s3.options(s3_endpoint=endpoint, backoff_initial=0.01, retries=3)
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/{key}", 0, 1 * MiB, **opts)
    assert isinstance(info.value.last_error, errors.IncompleteReadError)


async def test_complete_answered_200_with_error_body_fails_and_aborts(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    p, endpoint = proxy
    p.error_on_complete = True
    key = f"faults/complete-{uuid.uuid4().hex[:8]}"
    opts = moto_s3.options(s3_endpoint=endpoint, part_size=5 * MiB)
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts) as provider:
        writer = provider.open_writer(f"{S3_BUCKET}/{key}")
        await writer.write(os.urandom(11 * MiB))
        with pytest.raises(errors.ServiceUnavailableError, match="InternalError"):
            await writer.commit()
    assert not moto_s3.exists(S3_BUCKET, key)
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []
    assert any(s.startswith("DELETE") and "uploadId=" in s for s in p.seen)  # aborted


@pytest.mark.parametrize("versioned", [False, True], ids=["plain", "versioned"])
@pytest.mark.parametrize("size", [11 * MiB, 1000], ids=["multipart", "one-put"])
async def test_a_publish_in_flight_when_the_commit_is_stopped_is_removed_by_the_abort(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, size: int, versioned: bool
) -> None:
    """S3 carried out the request that publishes, and its answer is on its way
    when the commit is stopped (a cancelled ``cp``): S3 finishes a request it
    received, so the object exists although the writer was aborted -- unless
    the abort waits for that answer and removes the object again. In a versioned
    bucket it removed it by key, a delete marker hiding the previous version too: the
    version it published is removed now, the previous one the object again."""
    p, endpoint = proxy
    key = f"faults/stopped-{uuid.uuid4().hex[:8]}"
    bucket = S3_BUCKET
    if versioned:
        bucket = f"versioned-{uuid.uuid4().hex[:8]}"
        moto_s3.create_bucket(bucket)
        moto_s3.client.put_bucket_versioning(
            Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        moto_s3.put(bucket, key, b"previous version")
    opts = moto_s3.options(s3_endpoint=endpoint, part_size=5 * MiB)
    if size < MIN_PART_SIZE:  # a single PUT: held the same way
        p.match_put = f"/{bucket}/{key}"
    p.hold_complete_answer = asyncio.Event()
    async with tensorstream.get_provider(f"s3://{bucket}/{key}", **opts) as provider:
        writer = provider.open_writer(f"{bucket}/{key}")
        await writer.write(os.urandom(size))
        commit = asyncio.ensure_future(writer.commit())
        await asyncio.wait_for(p.complete_done.wait(), 60)
        assert moto_s3.exists(bucket, key)  # published; the answer is held
        commit.cancel()
        await asyncio.sleep(0.2)  # an abort that does not wait has finished by now
        p.hold_complete_answer.set()
        with pytest.raises(asyncio.CancelledError):
            await commit
        await writer.abort()
    if versioned:
        assert moto_s3.get(bucket, key) == b"previous version"
        listed = moto_s3.client.list_object_versions(Bucket=bucket, Prefix=key)
        assert listed.get("DeleteMarkers", []) == [] and len(listed["Versions"]) == 1
    else:
        assert not moto_s3.exists(bucket, key)
    assert moto_s3.open_multipart_uploads(bucket, key) == []


async def _write_or_copy(path: str, key: str, data: bytes, opts: dict[str, Any],
                         tmp_path: Path) -> CopyResult | None:
    """Store ``data`` at ``key``: through a writer (``path`` "write"), or as ``cp`` of a
    local file, whose outcome must be one clean copy (returned)."""
    if path == "write":
        async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts) as provider:
            writer = provider.open_writer(f"{S3_BUCKET}/{key}")
            await writer.write(data)
            await writer.commit()
        return None
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    result = await copy_async(str(src), f"s3://{S3_BUCKET}/{key}", **opts)
    assert result.errors == [] and result.outcomes[0].status == "copied"
    return result


@pytest.mark.parametrize("answer", [500, 0], ids=["answered-500", "timed-out"])
@pytest.mark.parametrize("path", ["write", "cp"])
@pytest.mark.parametrize("size", [11 * MiB, 1000], ids=["multipart", "one-put"])
async def test_a_publish_applied_whose_answer_was_lost_is_a_success(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, tmp_path: Path, answer: int, path: str,
    size: int,
) -> None:
    """S3 carried out CompleteMultipartUpload (or the one PutObject of a small
    object), and its answer was lost (a 5xx from a proxy in front, a timeout).
    The writer reported a failure ("nothing was published", cp: failed) while
    the object had been replaced by the new one. The object is looked at: it
    holds this write (its ETag is the one these bytes make), so it succeeded."""
    p, endpoint = proxy
    key = f"faults/lost-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, key, b"previous version")
    data = os.urandom(size)
    p.match_put = f"/{S3_BUCKET}/{key}" if size < MIN_PART_SIZE else None
    p.lose_complete_answer = answer
    opts = moto_s3.options(s3_endpoint=endpoint, part_size=5 * MiB, timeout_idle=1)
    result = await _write_or_copy(path, key, data, opts, tmp_path)
    assert result is None or result.verified
    assert moto_s3.get(S3_BUCKET, key) == data
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("size", [11 * MiB, 1000], ids=["multipart", "one-put"])
async def test_a_lost_publish_whose_tags_are_refused_removes_only_its_version(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, size: int,
) -> None:
    """A publish applied whose answer was lost, in a versioned bucket, with tags too long
    for the upload's header: the look that found it this write's named no version, so the
    PutObjectTagging refused after it had the object removed by key, a delete marker
    hiding the previous version (a 404 where the model was). Only the version written goes."""
    from tensorstream.providers.s3.tags import encode_tags

    p, endpoint = proxy
    bucket = f"versioned-{uuid.uuid4().hex[:8]}"
    moto_s3.create_bucket(bucket)
    moto_s3.client.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    key = f"faults/lost-tags-{uuid.uuid4().hex[:8]}"
    moto_s3.put(bucket, key, b"previous version")
    p.match_put = f"/{bucket}/{key}" if size < MIN_PART_SIZE else None
    p.lose_complete_answer = 500
    p.lose_once = True
    p.refuse_tagging = True
    tags = encode_tags((f"k{i}" * 40, "v" * 250) for i in range(10))  # (over 2 KiB)
    opts = moto_s3.options(s3_endpoint=endpoint, part_size=5 * MiB, backoff_initial=0.01)
    async with tensorstream.get_provider(f"s3://{bucket}/{key}", **opts) as provider:
        writer = provider.open_writer(f"{bucket}/{key}", metadata={"Tagging": tags})
        await writer.write(os.urandom(size))
        with pytest.raises(errors.PermissionDeniedError, match="removed"):
            await writer.commit()
    assert moto_s3.get(bucket, key) == b"previous version"
    listed = moto_s3.client.list_object_versions(Bucket=bucket, Prefix=key)
    assert listed.get("DeleteMarkers", []) == []
    assert [v["Size"] for v in listed.get("Versions", [])] == [len(b"previous version")]


async def _commit_fails_over_a_previous_version(
        moto_s3: MotoS3Server, endpoint: str, key: str, match: str | None = None,
        error: type[Exception] = errors.ServiceUnavailableError, bucket: str = S3_BUCKET,
        **options: Any) -> None:
    """``key`` holds a previous version; an 11 MiB multipart write through the
    proxy at ``endpoint`` must fail its commit with ``error``."""
    moto_s3.put(bucket, key, b"previous version")
    opts = moto_s3.options(s3_endpoint=endpoint, part_size=5 * MiB, **options)
    async with tensorstream.get_provider(f"s3://{bucket}/{key}", **opts) as provider:
        writer = provider.open_writer(f"{bucket}/{key}")
        await writer.write(os.urandom(11 * MiB))
        with pytest.raises(error, match=match):
            await writer.commit()


async def test_a_complete_that_failed_before_s3_applied_it_keeps_the_previous_version(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    """The neighbour: the object is looked at, holds the previous version, so the
    error stands and the upload is aborted."""
    p, endpoint = proxy
    p.error_on_complete = True
    key = f"faults/not-applied-{uuid.uuid4().hex[:8]}"
    await _commit_fails_over_a_previous_version(moto_s3, endpoint, key, match="InternalError")
    assert moto_s3.get(S3_BUCKET, key) == b"previous version"
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("encryption", ["none", "SSE-KMS"])
async def test_a_complete_applied_after_the_writer_looked_is_removed_by_its_abort(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, encryption: str,
) -> None:
    """The complete's answer was lost, the object still held the previous version
    when it was looked at, and S3 applied the complete only then: the abort found
    no upload (NoSuchUpload) and warned that a lifecycle rule would remove it,
    while the write reported as failed was published. The object now holds this
    upload, so the abort removes it, as it removes a publish that raced it. Under
    SSE-KMS (no ETag an MD5) it stayed, the write reported failed: the parts' CRC32s
    make its checksum, which says it is this upload."""
    p, endpoint = proxy
    p.complete_late = True
    key = f"faults/late-{uuid.uuid4().hex[:8]}"
    if encryption == "none":
        await _commit_fails_over_a_previous_version(moto_s3, endpoint, key)
    else:  # (its removal is conditional on the ETag, a header the front maps: signed anew)
        keys = (moto_s3.access_key_id, moto_s3.secret_access_key, moto_s3.region)
        with EncryptingFront(endpoint, _KMS, keys=keys) as front:
            await _commit_fails_over_a_previous_version(moto_s3, front.url, key,
                                                        backoff_initial=0.01)
    assert p.held_complete is None  # moto carried it out before the abort
    assert not moto_s3.exists(S3_BUCKET, key)  # not the failed write's bytes
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("encryption", ["none", "SSE-KMS"])
async def test_a_complete_applied_late_in_a_versioned_bucket_leaves_the_previous_version(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, encryption: str,
) -> None:
    """The neighbour in a versioned bucket: the abort removed the late-published object
    by key, so a delete marker hid the previous version too (a 404 where the write that
    failed should have left it) and the failed write's bytes stayed under it. It removes
    the version it looked at now: the previous version is the object again."""
    p, endpoint = proxy
    p.complete_late = True
    bucket = f"versioned-{uuid.uuid4().hex[:8]}"
    moto_s3.create_bucket(bucket)
    moto_s3.client.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    key = f"faults/late-{uuid.uuid4().hex[:8]}"
    if encryption == "none":
        await _commit_fails_over_a_previous_version(moto_s3, endpoint, key, bucket=bucket)
    else:
        with EncryptingFront(endpoint, _KMS) as front:
            await _commit_fails_over_a_previous_version(moto_s3, front.url, key, bucket=bucket,
                                                        backoff_initial=0.01)
    assert moto_s3.get(bucket, key) == b"previous version"
    listed = moto_s3.client.list_object_versions(Bucket=bucket, Prefix=key)
    assert listed.get("DeleteMarkers", []) == []
    assert [v["Size"] for v in listed.get("Versions", [])] == [len(b"previous version")]


_KMS = {"x-amz-server-side-encryption": "aws:kms"}
_SSE_C = {"x-amz-server-side-encryption-customer-algorithm": "AES256"}


@pytest.mark.parametrize("headers", [_KMS, _SSE_C], ids=["SSE-KMS", "SSE-C"])
@pytest.mark.parametrize("path", ["write", "cp"])
@pytest.mark.parametrize("retries", [1, 2], ids=["sent-once", "sent-again"])
async def test_an_encrypted_complete_applied_whose_answer_was_lost_is_a_success(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, tmp_path: Path, headers: dict[str, str],
    path: str, retries: int,
) -> None:
    """Under SSE-KMS or SSE-C no ETag is an MD5, so the object could not say whether
    the CompleteMultipartUpload whose answer was lost (a 500) was applied: the write
    was sent again, got NoSuchUpload and failed, while its object had replaced the
    previous version. The upload gone and the object holding as many parts and bytes,
    written since the write began, it is now the success it was."""
    p, endpoint = proxy
    key = f"faults/kms-lost-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, key, b"previous version")
    data = os.urandom(11 * MiB)
    p.lose_complete_answer, p.lose_once = 500, True
    with EncryptingFront(endpoint, headers) as front:
        opts = moto_s3.options(s3_endpoint=front.url, part_size=5 * MiB, retries=retries,
                               backoff_initial=0.01)
        await _write_or_copy(path, key, data, opts, tmp_path)
    assert moto_s3.get(S3_BUCKET, key) == data
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("retries", [1, 2])
async def test_an_encrypted_complete_not_applied_keeps_the_previous_version(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, retries: int,
) -> None:
    """The neighbour: the complete failed before S3 applied it (the upload still open):
    the error stands, the upload is aborted, the previous version stays."""
    p, endpoint = proxy
    p.error_on_complete = True
    key = f"faults/kms-failed-{uuid.uuid4().hex[:8]}"
    with EncryptingFront(endpoint, _KMS) as front:
        await _commit_fails_over_a_previous_version(
            moto_s3, front.url, key, match="InternalError", retries=retries,
            backoff_initial=0.01)
    assert moto_s3.get(S3_BUCKET, key) == b"previous version"
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


async def test_an_encrypted_upload_aborted_by_another_fails_saying_what_is_known(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server,
) -> None:
    """... and an upload that is gone while the object is not this write's (aborted
    by another, a lifecycle rule, while its complete failed) fails the write, saying
    that the upload is gone and the object does not hold it."""
    p, endpoint = proxy
    p.abort_on_complete = True
    key = f"faults/kms-aborted-{uuid.uuid4().hex[:8]}"
    with EncryptingFront(endpoint, _KMS) as front:
        await _commit_fails_over_a_previous_version(
            moto_s3, front.url, key, match=r"upload is gone .*NoSuchUpload.*not this write",
            error=errors.NotFoundError, retries=2, backoff_initial=0.01)
    assert moto_s3.get(S3_BUCKET, key) == b"previous version"
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("checksum", ["CRC32", None], ids=["crc32", "no-checksum"])
async def test_an_encrypted_upload_aborted_while_another_writer_stored_as_many_parts_fails(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, checksum: str | None,
) -> None:
    """The upload gone (another's abort), and meanwhile another writer stored other bytes
    of the same size in as many parts: the part count, the size and the date agreed, and
    the write reported the success of bytes that were not its own. The parts' CRC32s
    (sent with every part) make the object's checksum, which the other bytes do not have
    (or have none): the write fails, naming what the object holds."""
    p, endpoint = proxy
    p.abort_on_complete, p.replace_checksum = True, checksum
    p.replace_on_abort = theirs = os.urandom(11 * MiB)
    key = f"faults/kms-replaced-{uuid.uuid4().hex[:8]}"
    with EncryptingFront(endpoint, _KMS) as front:
        await _commit_fails_over_a_previous_version(
            moto_s3, front.url, key, match=r"upload is gone .*not this write",
            error=errors.NotFoundError, retries=2, backoff_initial=0.01)
    assert moto_s3.get(S3_BUCKET, key) == theirs  # (theirs, left alone)
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []


@pytest.mark.parametrize("headers", [_KMS, _SSE_C], ids=["SSE-KMS", "SSE-C"])
@pytest.mark.parametrize("path", ["write", "cp"])
async def test_an_encrypted_put_applied_whose_answer_was_lost_is_a_success(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server, tmp_path: Path, headers: dict[str, str],
    path: str,
) -> None:
    """The one PutObject of a small object under SSE-KMS or SSE-C, applied by S3 each time
    and its answer lost each time: the look before a resend and after the last failure
    compared the ETag with the bytes' MD5, which it is not there, so the write failed while
    its object had replaced the previous version. The CRC32 S3 keeps of the bytes (sent
    with the PutObject) says it holds them: the success it was."""
    p, endpoint = proxy
    key = f"faults/kms-put-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, key, b"previous version")
    data = os.urandom(1000)
    p.match_put, p.lose_complete_answer = f"/{S3_BUCKET}/{key}", 500
    with EncryptingFront(endpoint, headers) as front:
        opts = moto_s3.options(s3_endpoint=front.url, retries=2, backoff_initial=0.01)
        await _write_or_copy(path, key, data, opts, tmp_path)
    assert moto_s3.get(S3_BUCKET, key) == data


async def test_an_encrypted_put_not_applied_keeps_the_previous_version(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server,
) -> None:
    """The neighbour: the PutObject under SSE-KMS failed before S3 applied it (the object
    holds the previous version, of another CRC32): the write fails, the version stays."""
    p, endpoint = proxy
    key = f"faults/kms-put-refused-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, key, b"previous version")
    p.match_put, p.refuse_put = f"/{S3_BUCKET}/{key}", True
    with EncryptingFront(endpoint, _KMS) as front:
        opts = moto_s3.options(s3_endpoint=front.url, retries=2, backoff_initial=0.01)
        async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts) as provider:
            writer = provider.open_writer(f"{S3_BUCKET}/{key}")
            await writer.write(os.urandom(1000))
            with pytest.raises(errors.ServiceUnavailableError):
                await writer.commit()
    assert moto_s3.get(S3_BUCKET, key) == b"previous version"
