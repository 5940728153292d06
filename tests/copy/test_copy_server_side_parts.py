"""Multipart copies made by S3 (``UploadPartCopy``) when something goes wrong: a store
that has no ``UploadPartCopy`` (or no ``CopyObject``) loses only that way of copying for
the run; a copy that fails waits for its parts still in flight before it aborts the
upload, so none lands after the abort and none is left behind. moto's server behind the
package's fault proxy, which records every request in the order moto answered it."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import re
import time
from typing import Any

import pytest

from s3_loop_front import LoopFront, pass_on, send_back
from s3_parts import copy_cancelled_while_held, hold_one_part, put_in_parts
from tensorstream.copy.engine import copy

MiB = 1 << 20


def _source(backend: Any, tmp_path: Any, how: str, parts: list[bytes]) -> str:
    """The source of a copy of ``parts`` to ``backend``'s bucket: ``"by S3"``, an object
    uploaded in those parts to the same bucket (``src/m.bin``, copied by S3); else a local
    file of their bytes (streamed)."""
    if how == "by S3":
        put_in_parts(backend, "src/m.bin", parts)
        return str(backend.uri("src/m.bin"))
    (tmp_path / "m.bin").write_bytes(b"".join(parts))
    return str(tmp_path / "m.bin")


def _uploads_left(backend: Any) -> list[str]:
    """The ids of the multipart uploads still open in ``backend``'s bucket, sorted."""
    return sorted(u["UploadId"] for u in backend.client.list_multipart_uploads(
        Bucket=backend.bucket).get("Uploads", []))


def _copy_requests(backend: Any, key: str) -> list[Any]:
    """Requests that asked S3 to copy into ``key`` (CopyObject, UploadPartCopy)."""
    return [q for q in backend.requests if q.path.split("?")[0] == f"/{backend.bucket}/{key}"
            and any(h.lower() == "x-amz-copy-source" for h in q.headers)]


def test_a_store_without_upload_part_copy_still_copies_objects_in_one_piece(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """501 to UploadPartCopy turned every copy by S3 off for the rest of the run: objects
    stored in one piece, which one CopyObject copies, were streamed through this machine
    too. Now only the multipart copies are (one warning): the later multipart object goes
    straight to the streamed copy, one-piece objects are still copied by S3, and the upload
    the refused copy opened is aborted."""
    b = tensorstream_s3
    big = {f"src/m{i}.bin": [os.urandom(5 * MiB), os.urandom(1000)] for i in (1, 2)}
    for key, parts in big.items():
        put_in_parts(b, key, parts)
    b.put("src/z-small.bin", b"small")
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/m1.bin"
    b.faults.raw.status_script = [200, 501]  # CreateMultipartUpload, then UploadPartCopy
    b.proxy.clear_log()
    with caplog.at_level(logging.WARNING, logger="tensorstream.copy"):
        r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, concurrency=1,
                 **b.options)
    assert r.ok and r.files == 3, r.errors
    by_name = {o.src.rsplit("/", 1)[-1]: o for o in r.outcomes}
    assert by_name["z-small.bin"].server_side and by_name["z-small.bin"].verified
    assert not by_name["m1.bin"].server_side
    # jobs=1 is kept (it widened to more objects on a busy machine, and m2 could start
    # before m1's 501 was known): m2 starts after it, and is not asked of S3 at all.
    assert not by_name["m2.bin"].server_side
    assert _copy_requests(b, "dst/m2.bin") == []  # not asked again
    lines = [rec for rec in caplog.records if "through this machine" in rec.getMessage()]
    assert len(lines) == 1 and "UploadPartCopy" in lines[0].getMessage(), caplog.records
    for key, parts in big.items():
        assert b.get(key.replace("src/", "dst/")) == b"".join(parts)
    assert b.get("dst/z-small.bin") == b"small"
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_a_store_without_copy_object_still_copies_objects_in_parts(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The neighbour: 501 to CopyObject streams the objects stored in one piece; an object
    uploaded in parts is still copied by S3 (UploadPartCopy is another operation)."""
    b = tensorstream_s3
    b.put("src/a-small.bin", b"a")
    b.put("src/b-small.bin", b"b")
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    put_in_parts(b, "src/m.bin", parts)
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/a-small.bin"
    b.faults.raw.status_script = [501]
    b.proxy.clear_log()
    with caplog.at_level(logging.WARNING, logger="tensorstream.copy"):
        r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, **b.options)
    assert r.ok and r.files == 3, r.errors
    by_name = {o.src.rsplit("/", 1)[-1]: o for o in r.outcomes}
    assert not by_name["a-small.bin"].server_side and not by_name["b-small.bin"].server_side
    assert by_name["m.bin"].server_side and by_name["m.bin"].verified_by == "ETag"
    assert _copy_requests(b, "dst/b-small.bin") == []
    assert b.get("dst/m.bin") == b"".join(parts) and b.get("dst/b-small.bin") == b"b"
    lines = [rec for rec in caplog.records if "through this machine" in rec.getMessage()]
    assert len(lines) == 1 and "CopyObject" in lines[0].getMessage(), caplog.records


def test_a_failed_multipart_copy_waits_for_its_parts_in_flight_before_the_abort(
        tensorstream_s3: Any) -> None:
    """One part refused while another is still being copied by S3: the copy cancelled the
    part in flight on its side and aborted the upload at once, but S3 goes on with a
    request it has (here: it reaches moto a second later), and a part can land after the
    AbortMultipartUpload (S3's documentation: abort again). Now the copy stops starting
    parts, waits for those in flight, then aborts: no part request is answered after the
    abort, and no upload is left."""
    b = tensorstream_s3
    put_in_parts(b, "src/m.bin", [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1000)])
    key = f"/{b.bucket}/dst/m.bin"
    hold_one_part(b, "dst/m.bin")
    r = copy(b.uri("src/m.bin"), b.uri("dst/m.bin"), concurrency=3, **b.options)
    assert not r.ok and "refused" in r.errors[0], r.errors
    time.sleep(1.5)  # for a request S3 had to be answered, whatever the copy did
    log = [(q.method, q.path, q.status) for q in b.requests
           if q.path.split("?")[0] == key]
    aborts = [i for i, (m, p, _) in enumerate(log) if m == "DELETE" and "uploadId" in p]
    assert aborts, log
    assert not [q for q in log[aborts[0]:] if q[0] == "PUT"], log
    assert b.server.open_multipart_uploads(b.bucket) == []
    assert not b.server.exists(b.bucket, "dst/m.bin")


class _CreateLostFront(LoopFront):
    """A reverse proxy (in front of the fault proxy) whose first CreateMultipartUpload is
    applied by moto and answered as if lost (``lost``: ``"500"``, or ``"cut"``: the
    connection closed mid-answer); and, as S3 does where moto does not, each upload listed
    with the time it was made (moto lists every one as made in 2010)."""

    def __init__(self, upstream: str, lost: str) -> None:
        super().__init__()
        self.upstream, self.lost = upstream, lost
        self.made: dict[str, str] = {}  # upload id -> when it was made (ISO, ms)
        self.lost_ids: list[str] = []
        self.armed = False  # from now on, the first create's answer is lost

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        if (self.lost == "SlowDown" and self.armed and not self.lost_ids
                and request.method == "POST" and "uploads" in request.query):
            self.lost_ids.append("")  # (refused, never applied: no upload made)
            return web.Response(status=503, content_type="application/xml", body=(
                b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate."
                b"</Message></Error>"))
        status, out, answer, length = await pass_on(request, self.upstream, await request.read())
        if request.method == "POST" and "uploads" in request.query and status == 200:
            upload = re.search(rb"<UploadId>(.*?)</UploadId>", answer)
            assert upload is not None
            now = datetime.datetime.now(datetime.timezone.utc)
            self.made[upload.group(1).decode()] = now.isoformat(timespec="milliseconds")
            if self.armed and not self.lost_ids:
                self.lost_ids.append(upload.group(1).decode())
                if self.lost == "500":
                    return web.Response(status=500, content_type="application/xml", body=(
                        b"<Error><Code>InternalError</Code><Message>We encountered an "
                        b"internal error.</Message></Error>"))
                resp = web.StreamResponse(status=200, headers=out)
                resp.content_length = len(answer)
                await resp.prepare(request)
                await resp.write(answer[:50])
                request.transport.close()
                return resp
        if request.method == "GET" and "uploads" in request.query and status == 200:
            answer = re.sub(rb"<Upload>(.*?<UploadId>(.*?)</UploadId>.*?)</Upload>",
                            lambda m: self.when_made(m.group(2).decode(), m.group(0)),
                            answer, flags=re.S)
        return await send_back(request, status, out, answer, length)

    def when_made(self, upload: str, listed: bytes) -> bytes:
        """``listed`` (an upload's ``<Upload>`` of a listing) with the time ``upload``
        was made, where this front saw it made."""
        made = self.made.get(upload)
        return listed if made is None else re.sub(
            rb"<Initiated>.*?</Initiated>",
            b"<Initiated>" + made.replace("+00:00", "Z").encode() + b"</Initiated>", listed)


@pytest.mark.parametrize("retries", [1, 3], ids=["sent-once", "sent-again"])
@pytest.mark.parametrize("stranger", ["old", "with a part", "in the same seconds"])
@pytest.mark.parametrize("lost", ["500", "cut"])
@pytest.mark.parametrize("how", ["by S3", "streamed"])
def test_an_upload_whose_create_answer_was_lost_is_not_left_behind(
        tensorstream_s3: Any, tmp_path: Any, how: str, lost: str, stranger: str,
        retries: int, caplog: pytest.LogCaptureFixture) -> None:
    """CreateMultipartUpload applied by S3, its answer lost: the copy never learnt the
    upload's id, so nothing aborted it, and it stayed open, its parts billed, until a
    lifecycle rule removed it. The upload of that key S3 made while the request was in
    flight, with no part, is now aborted; another writer's is never: one made earlier, or
    one with a part, is left and ours aborted; two in the same seconds without parts cannot
    be told apart, and both are left (said in the log). Sent once, the copy fails; sent
    again under the retry policy (as every other request is), it lands, and the lost
    upload is aborted all the same, never the one the resend was answered with."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    src = _source(b, tmp_path, how, parts)
    key = "dst/m.bin"
    front = _CreateLostFront(b.proxy.url, lost)
    with front as endpoint:
        options = {**b.options, "s3_endpoint": endpoint}
        if stranger == "old":  # (moto's own time: 2010)
            other = b.client.create_multipart_upload(Bucket=b.bucket, Key=key)["UploadId"]
        else:
            made = _client(b, endpoint).create_multipart_upload(Bucket=b.bucket, Key=key)
            other = made["UploadId"]
            if stranger == "with a part":
                b.client.upload_part(Bucket=b.bucket, Key=key, UploadId=other, PartNumber=1,
                                     Body=b"x")
        front.armed = True
        with caplog.at_level(logging.INFO, logger="tensorstream.s3"):
            r = copy(src, b.uri(key), part_size=5 * MiB, retries=retries,
                     backoff_initial=0.01, backoff_max=0.05, **options)
    if retries == 1:
        assert not r.ok, r.errors
    else:
        assert r.ok, r.errors
        assert b.server.get(b.bucket, key) == b"".join(parts)
    left = _uploads_left(b)
    if stranger == "in the same seconds":
        assert left == sorted([other, *front.lost_ids]), (r.errors, left)
        assert any("none is aborted" in rec.getMessage() for rec in caplog.records)
    else:
        assert left == [other], (r.errors, left)
        assert any("was lost" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize("how", ["by S3", "streamed"])
def test_a_create_s3_refused_as_throttled_never_aborts_another_writers_upload(
        tensorstream_s3: Any, tmp_path: Any, how: str, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A CreateMultipartUpload that S3 answered ``503 SlowDown`` was looked for as if its
    answer were lost: S3 made no upload for it, so the one upload without a part made in
    those seconds, another writer's (its first part still on its way), was aborted under
    it, and that writer's write failed. A throttled request is refused before S3 applies
    it: nothing is looked for, and the other writer's upload stays; the create is sent
    again (it was not: the copy failed) and the copy lands."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    src = _source(b, tmp_path, how, parts)
    key = "dst/m.bin"
    front = _CreateLostFront(b.proxy.url, "SlowDown")
    with front as endpoint:
        options = {**b.options, "s3_endpoint": endpoint}
        other = _client(b, endpoint).create_multipart_upload(Bucket=b.bucket, Key=key)["UploadId"]
        front.armed = True
        with caplog.at_level(logging.INFO, logger="tensorstream.s3"):
            r = copy(src, b.uri(key), part_size=5 * MiB, **options)
    assert r.ok, r.errors
    assert b.server.get(b.bucket, key) == b"".join(parts)
    assert front.lost_ids == [""]
    assert _uploads_left(b) == [other], r.errors
    assert not [q for q in b.requests if q.method == "GET" and "uploads" in q.path], (
        "a throttled create is not looked for")


class _StrangerWhileListing(_CreateLostFront):
    """A front whose listing of uploads is slow (3 s): meanwhile, after the lost
    CreateMultipartUpload's answer, another writer starts an upload of the same key."""

    def __init__(self, upstream: str, lost: str, client: Any, bucket: str, key: str) -> None:
        super().__init__(upstream, lost)
        self.client, self.bucket, self.key = client, bucket, key
        self.others: list[str] = []

    async def _forward(self, request: Any) -> Any:
        if request.method == "GET" and "uploads" in request.query and not self.others:
            await asyncio.sleep(2.5)
            made = await asyncio.to_thread(self.client.create_multipart_upload,
                                           Bucket=self.bucket, Key=self.key)
            self.others.append(made["UploadId"])
            await asyncio.sleep(0.5)
        return await super()._forward(request)


@pytest.mark.parametrize("lost", ["500", "cut"])
@pytest.mark.parametrize("how", ["by S3", "streamed"])
def test_an_upload_another_writer_starts_after_the_lost_answer_is_never_aborted(
        tensorstream_s3: Any, tmp_path: Any, how: str, lost: str) -> None:
    """Only an upload made while the CreateMultipartUpload was in flight can be the lost
    one: another writer's, started after its answer came (while the uploads were listed,
    slowly), was counted too (the window ran to the listing's end): two without a part,
    so neither was aborted, and where the lost create was never applied, the other
    writer's alone was aborted under it."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    src = _source(b, tmp_path, how, parts)
    key = "dst/m.bin"
    front = _StrangerWhileListing(b.proxy.url, lost, None, b.bucket, key)
    with front as endpoint:
        front.client = _client(b, endpoint)
        front.armed = True
        r = copy(src, b.uri(key), part_size=5 * MiB, retries=1,  # (sent once: it fails)
                 **{**b.options, "s3_endpoint": endpoint})
    assert not r.ok, r.errors
    assert front.lost_ids and front.others
    left = _uploads_left(b)
    assert left == front.others, (r.errors, left, front.lost_ids)


class _UploadsByPage(_CreateLostFront):
    """A front listing multipart uploads one a page (``IsTruncated``, ``NextKeyMarker``,
    ``NextUploadIdMarker``, as S3 does past 1000), in the order made, with their times."""

    async def _forward(self, request: Any) -> Any:
        from aiohttp import ClientSession, web
        from yarl import URL

        if not (request.method == "GET" and "uploads" in request.query):
            return await super()._forward(request)
        async with ClientSession() as session, session.get(  # (moto ignores the markers)
                URL(self.upstream + request.raw_path, encoded=True), headers={
                    k: v for k, v in request.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding")}) as up:
            answer = await up.read()
        uploads = re.findall(rb"<Upload>.*?</Upload>", answer, flags=re.S)
        ids = [re.search(rb"<UploadId>(.*?)</UploadId>", u).group(1).decode()  # type: ignore
               for u in uploads]
        after = request.query.get("upload-id-marker")
        at = ids.index(after) + 1 if after in ids else 0
        page, more = uploads[at: at + 1], at + 1 < len(uploads)
        page = [self.when_made(ids[at + i], up_xml) for i, up_xml in enumerate(page)]
        key = re.search(rb"<Key>(.*?)</Key>", page[0]).group(1) if page else b""  # type: ignore
        tail = (b"<IsTruncated>true</IsTruncated><NextKeyMarker>" + key + b"</NextKeyMarker>"
                b"<NextUploadIdMarker>" + ids[at].encode() + b"</NextUploadIdMarker>"
                if more else b"<IsTruncated>false</IsTruncated>")
        body = (b'<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult xmlns='
                b'"http://s3.amazonaws.com/doc/2006-03-01/"><MaxUploads>1</MaxUploads>'
                + tail + b"".join(page) + b"</ListMultipartUploadsResult>")
        return web.Response(body=body, content_type="application/xml")


@pytest.mark.parametrize("stranger", ["old", "in the same seconds"])
@pytest.mark.parametrize("how", ["by S3", "streamed"])
def test_an_upload_whose_create_answer_was_lost_is_found_on_a_later_page(
        tensorstream_s3: Any, tmp_path: Any, how: str, stranger: str) -> None:
    """S3 lists a key's multipart uploads oldest first, 1000 a page: the lost one, the
    newest, came on a later page of a key with many, and only the first page was read
    (it was left open). Pages of that key's uploads are followed now; two without parts
    made in the same seconds, on two pages, are still both left."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    src = _source(b, tmp_path, how, parts)
    key = "dst/m.bin"
    front = _UploadsByPage(b.proxy.url, "500")
    with front as endpoint:
        if stranger == "old":  # (moto's own time: 2010)
            other = b.client.create_multipart_upload(Bucket=b.bucket, Key=key)["UploadId"]
        else:
            other = _client(b, endpoint).create_multipart_upload(Bucket=b.bucket,
                                                                 Key=key)["UploadId"]
        front.armed = True
        r = copy(src, b.uri(key), part_size=5 * MiB, retries=1,  # (sent once: it fails)
                 **{**b.options, "s3_endpoint": endpoint})
    assert not r.ok, r.errors
    left = _uploads_left(b)
    expected = [other] if stranger == "old" else [other, *front.lost_ids]
    assert left == sorted(expected), (r.errors, left, front.lost_ids)


def _client(backend: Any, endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=backend.options["s3_region"],
                        aws_access_key_id=backend.options["s3_access_key_id"],
                        aws_secret_access_key=backend.options["s3_secret_access_key"])


def test_ctrl_c_while_s3_creates_the_upload_of_a_copy_leaves_none(tensorstream_s3: Any) -> None:
    """Ctrl-C (the copy's task cancelled) while the CreateMultipartUpload of a copy by S3
    was on its way: S3 made the upload, the copy never learnt its id, and it stayed open.
    The request's answer is now waited for (shielded, as the streamed writer's is) and
    the upload aborted."""
    b = tensorstream_s3
    put_in_parts(b, "src/m.bin", [os.urandom(5 * MiB), b"end"])
    result = copy_cancelled_while_held(b, b.uri("src/m.bin"), "dst/m.bin", "POST")
    time.sleep(1.5)  # for a request S3 had to be answered, whatever the copy did
    assert [o.status for o in result.outcomes] == ["interrupted"]
    assert b.server.open_multipart_uploads(b.bucket) == []


class _FirstAbortLost(_CreateLostFront):
    """A front whose first AbortMultipartUpload is answered 204 and never reaches moto,
    as an abort is after which a part S3 was storing lands: the upload is still listed."""

    def __init__(self, upstream: str, lost: int = 1) -> None:
        super().__init__(upstream, "500")
        self.swallowed = 0
        self.lost = lost

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        if request.method == "DELETE" and "uploadId" in request.query \
                and self.swallowed < self.lost:
            self.swallowed += 1
            return web.Response(status=204)
        return await super()._forward(request)


def _copy_losing_aborts(backend: Any, src: str, lost: int) -> tuple[Any, _FirstAbortLost]:
    """Copy ``src`` to ``dst/m.bin`` of ``backend``, its first part refused (403) and its
    first ``lost`` aborts answered but never applied; the result and the front."""
    backend.faults.raw.path_prefix = f"/{backend.bucket}/dst/m.bin"
    backend.faults.raw.status_script = [200, 403]  # CreateMultipartUpload, the first part
    front = _FirstAbortLost(backend.proxy.url, lost=lost)
    with front as endpoint:
        r = copy(src, backend.uri("dst/m.bin"), part_size=5 * MiB, concurrency=1,
                 **{**backend.options, "s3_endpoint": endpoint})
    return r, front


@pytest.mark.parametrize("how", ["by S3", "streamed"])
def test_an_upload_still_listed_after_its_abort_is_aborted_again(
        tensorstream_s3: Any, tmp_path: Any, how: str) -> None:
    """A failed multipart upload (a part refused) is aborted, then aborted again while
    ListParts still finds it; it stayed open when the first abort did not take."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), b"end"]
    src = _source(b, tmp_path, how, parts)
    r, front = _copy_losing_aborts(b, src, lost=1)
    assert not r.ok, r.errors
    assert front.swallowed == 1
    assert b.server.open_multipart_uploads(b.bucket) == []


@pytest.mark.parametrize("how", ["by S3", "streamed"])
def test_an_upload_still_listed_after_every_abort_is_named_the_same_either_way(
        tensorstream_s3: Any, tmp_path: Any, how: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every abort answered but never applied: a streamed upload's writer sent three and
    said nothing of the upload left; a copy by S3 warned. Both now abort three times
    (one rule, :mod:`tensorstream.providers.s3.aborts`) and name the upload left."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), b"end"]
    src = _source(b, tmp_path, how, parts)
    caplog.set_level(logging.WARNING, logger="tensorstream")
    r, front = _copy_losing_aborts(b, src, lost=10)
    assert not r.ok, r.errors
    assert front.swallowed == 3
    left = b.server.client.list_multipart_uploads(Bucket=b.bucket, Prefix="dst/m.bin")["Uploads"]
    said = [m for m in caplog.messages if "still listed after 3 aborts" in m]
    assert len(said) == 1 and left[0]["UploadId"] in said[0], caplog.messages
    b.server.client.abort_multipart_upload(Bucket=b.bucket, Key="dst/m.bin",
                                           UploadId=left[0]["UploadId"])
