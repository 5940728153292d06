"""An S3 object's tags on its copy to another key, as ``aws s3 cp`` (``--copy-props
default``) keeps them: one ``CopyObject`` keeps them itself; a copy S3 makes in parts
(``UploadPartCopy``) and a copy streamed through this machine (another key pair per side,
``--no-server-side-copy``) read them (``GetObjectTagging``) and give them to the new
object. moto's server behind the package's fault proxy, which records every request."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from iam_users import iam_user_keys
from s3_loop_front import LoopFront, pass_on, send_back
from tensorstream.copy.engine import copy
from tensorstream.testing.http_proxy import HTTPFaultProxy

MiB = 1 << 20
_TAGS = [{"Key": "team", "Value": "ml"}, {"Key": "keep", "Value": "a b+c/é"}]
_TAGGING = "team=ml&keep=a%20b%2Bc%2F%C3%A9"
#: (copy options, how the copy is made): by S3 in one piece, by S3 in parts, streamed in
#: one PutObject, streamed in parts.
_WAYS = {
    "CopyObject": ({}, 1 * MiB),
    "UploadPartCopy": ({"copy_cutoff": 5 * MiB, "part_size": 5 * MiB}, 6 * MiB),
    "streamed whole": ({"server_side_copy": False}, 1 * MiB),
    "streamed in parts": ({"server_side_copy": False, "part_size": 5 * MiB}, 6 * MiB),
}


def _tags(backend: Any, key: str) -> list[dict[str, str]]:
    return list(backend.client.get_object_tagging(Bucket=backend.bucket, Key=key)["TagSet"])


@pytest.mark.parametrize("way", list(_WAYS))
def test_a_copy_to_another_key_keeps_the_source_tags(tensorstream_s3: Any, way: str) -> None:
    """A copy made in parts, by S3 or through this machine, and a streamed one in one
    piece, dropped every tag (a new upload has none unless given them), where one
    CopyObject kept them. Every way keeps them now, bytes and metadata as before."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    data = os.urandom(size)
    b.client.put_object(Bucket=b.bucket, Key="t/src.bin", Body=data, ContentType="x/model",
                        Tagging=_TAGGING)
    r = copy(b.uri("t/src.bin"), b.uri("t/dst.bin"), **b.options, **options)
    assert r.ok, r.errors
    assert r.outcomes[0].server_side == (way in ("CopyObject", "UploadPartCopy"))
    assert _tags(b, "t/dst.bin") == _TAGS
    assert b.get("t/dst.bin") == data
    head = b.client.head_object(Bucket=b.bucket, Key="t/dst.bin")
    assert head["ContentType"] == "x/model"
    assert b.server.open_multipart_uploads(b.bucket) == []
    # The neighbour: a source without tags gives its copy none, and no Tagging is sent.
    b.put("t/plain.bin", data)
    b.proxy.clear_log()
    r = copy(b.uri("t/plain.bin"), b.uri("t/plain-copy.bin"), **b.options, **options)
    assert r.ok, r.errors
    assert _tags(b, "t/plain-copy.bin") == []
    assert not any(h.lower() == "x-amz-tagging" for q in b.requests for h in q.headers)


@pytest.mark.parametrize("way", ["UploadPartCopy", "streamed whole", "streamed in parts"])
def test_a_copy_whose_source_tags_cannot_be_read_is_refused(moto_s3: Any, way: str) -> None:
    """A key pair that may not read the source's tags (no s3:GetObjectTagging): as
    ``aws s3 cp`` fails such a copy in parts, it is refused naming the permission, and
    nothing is written (no object, no upload left); a copy in one CopyObject, which S3
    makes with the tags itself, is not asked for them."""
    prefix = f"tags-{os.urandom(4).hex()}"
    options, size = _WAYS[way]
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/src.bin", Body=os.urandom(size),
                              Tagging="team=ml")
    keys = moto_s3.options(**iam_user_keys(moto_s3, "no-tags-read", [
        {"Effect": "Allow", "Action": "s3:*",
         "Resource": [f"arn:aws:s3:::{S3_BUCKET}", f"arn:aws:s3:::{S3_BUCKET}/*"]},
        {"Effect": "Deny", "Action": "s3:GetObjectTagging",
         "Resource": f"arn:aws:s3:::{S3_BUCKET}/*"}]))
    src, dst = f"s3://{S3_BUCKET}/{prefix}/src.bin", f"s3://{S3_BUCKET}/{prefix}/dst.bin"
    r = copy(src, dst, **keys, **options)
    assert not r.ok and len(r.errors) == 1, r.errors
    assert "s3:GetObjectTagging" in r.errors[0] and "nothing was copied" in r.errors[0]
    listed = moto_s3.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{prefix}/")
    assert [o["Key"] for o in listed.get("Contents", [])] == [f"{prefix}/src.bin"]
    assert moto_s3.open_multipart_uploads(S3_BUCKET, f"{prefix}/dst.bin") == []
    # The neighbour: one CopyObject sends no GetObjectTagging (S3 copies the tags).
    small = f"s3://{S3_BUCKET}/{prefix}/small.bin"
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/small.bin", Body=b"x",
                              Tagging="team=ml")
    r = copy(small, f"{small}.copy", **keys)
    assert r.ok and r.outcomes[0].server_side, r.errors


@pytest.mark.parametrize("way", ["UploadPartCopy", "streamed in parts"])
def test_a_store_without_tags_still_copies(tensorstream_s3: Any, way: str) -> None:
    """A store that has no object tags (R2 answers GetObjectTagging 501 NotImplemented)
    holds none to keep: the copy is made, not refused."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    data = os.urandom(size)
    b.put("t/untagged.bin", data)
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [501]
    r = copy(b.uri("t/untagged.bin"), b.uri("t/copy.bin"), **b.options, **options)
    assert r.ok, r.errors
    assert [q.status for q in b.requests if q.path.endswith("?tagging")] == [501]
    assert b.get("t/copy.bin") == data


@pytest.mark.parametrize("refused", [True, False])
@pytest.mark.parametrize("way", ["streamed whole", "streamed in parts"])
def test_a_public_source_read_without_a_key_pair_still_copies(
        moto_s3_public: Any, way: str, refused: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A public object read without a key pair (``--no-sign-request`` for the source,
    another key pair for the destination: streamed). S3 answers an unsigned
    GetObjectTagging ``403 AccessDenied`` (a public-read object grants its bytes, not its
    tags), and the copy was refused, ``nothing was copied``: no copy of a public object
    into one's own bucket could be made at all. Tags no key pair can read are none to
    keep: the copy is made without them, said in a warning. The neighbour: a bucket that
    lets anyone read them keeps them."""
    s = moto_s3_public
    options, size = _WAYS[way]
    data = os.urandom(size)
    prefix = f"public-{os.urandom(4).hex()}"
    s.client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/src.bin", Body=data,
                        ACL="public-read", Tagging=_TAGGING)
    with HTTPFaultProxy(s.endpoint_url) as proxy:
        if refused:
            proxy.faults.query, proxy.faults.status_script = "tagging", [403]
        src = {"s3_endpoint": proxy.url, "s3_region": s.region, "anonymous": True}
        with caplog.at_level(logging.WARNING):
            r = copy(f"s3://{S3_BUCKET}/{prefix}/src.bin", f"s3://{S3_BUCKET}/{prefix}/dst.bin",
                     src_options=src, dst_options=s.options(), **options)
        assert [q.status for q in proxy.requests if q.path.endswith("?tagging")] == [
            403 if refused else 200]
    assert r.ok, r.errors
    assert s.client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/dst.bin")["Body"].read() == data
    got = s.client.get_object_tagging(Bucket=S3_BUCKET, Key=f"{prefix}/dst.bin")["TagSet"]
    assert got == ([] if refused else _TAGS)
    warned = [rec.getMessage() for rec in caplog.records if "tags" in rec.getMessage()]
    assert len(warned) == (1 if refused else 0), warned
    assert not refused or "copied without them" in warned[0]


#: S3's largest tag set: 10 tags, 128-character keys, 256-character values (3,859 bytes
#: as an ``x-amz-tagging`` header, over the 2 KiB ``aws s3 cp`` sends in one).
_LARGE = [{"Key": f"{i}" + "k" * 127, "Value": f"{i}" + "v/é" * 85} for i in range(10)]


def _header_sizes(requests: list[Any]) -> list[int]:
    return [len(v.encode()) for q in requests for h, v in q.headers.items()
            if h.lower() == "x-amz-tagging"]


@pytest.mark.parametrize("way", list(_WAYS))
def test_a_copy_keeps_a_tag_set_too_large_for_one_header(tensorstream_s3: Any,
                                                          way: str) -> None:
    """S3's largest tag set (10 tags of 128-character keys and 256-character values):
    sent as one ``x-amz-tagging`` header of 11 KB with the upload (a copy in parts, by S3
    or streamed; a streamed copy in one PutObject), over what S3 takes in a header. As
    ``aws s3 cp``, a tag set over 2 KiB encoded is set by a PutObjectTagging once the
    object is written; one CopyObject keeps the tags itself (S3 copies them)."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    data = os.urandom(size)
    b.client.put_object(Bucket=b.bucket, Key="t/large.bin", Body=data)
    b.client.put_object_tagging(Bucket=b.bucket, Key="t/large.bin",
                                Tagging={"TagSet": _LARGE})
    b.proxy.clear_log()
    r = copy(b.uri("t/large.bin"), b.uri("t/large-copy.bin"), **b.options, **options)
    assert r.ok, r.errors
    assert _tags(b, "t/large-copy.bin") == _LARGE
    assert b.get("t/large-copy.bin") == data
    assert all(n <= 2048 for n in _header_sizes(b.requests)), _header_sizes(b.requests)
    puts = [q for q in b.requests if q.method == "PUT" and q.path.endswith("?tagging")]
    assert len(puts) == (0 if way == "CopyObject" else 1)
    assert b.server.open_multipart_uploads(b.bucket) == []


@pytest.mark.parametrize("way", ["UploadPartCopy", "streamed whole", "streamed in parts"])
def test_a_tag_set_set_after_the_copy_and_refused_fails_it(tensorstream_s3: Any,
                                                            way: str) -> None:
    """The PutObjectTagging after the copy refused (403: no s3:PutObjectTagging): as
    ``aws s3 cp``, the copy fails and is removed (left without its tags it would look
    done, and ``sync`` would skip it from then on); the error says the object was
    written, its tags not, that it was removed, and what leaves the tags out."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    b.client.put_object(Bucket=b.bucket, Key="t/refused.bin", Body=os.urandom(size))
    b.client.put_object_tagging(Bucket=b.bucket, Key="t/refused.bin",
                                Tagging={"TagSet": _LARGE})
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]  # GetObjectTagging read, PutObjectTagging refused
    r = copy(b.uri("t/refused.bin"), b.uri("t/refused-copy.bin"), **b.options, **options)
    assert not r.ok and len(r.errors) == 1, r.errors
    said = r.errors[0]
    assert "the object was written, but its 10 tags" in said, said
    assert "s3:PutObjectTagging" in said and "removed" in said, said
    assert "--copy-props metadata-directive" in said, said
    assert [q.status for q in b.requests if q.path.endswith("?tagging")] == [200, 403]
    listed = b.client.list_objects_v2(Bucket=b.bucket, Prefix="t/refused-copy")
    assert listed.get("Contents", []) == []
    assert b.server.open_multipart_uploads(b.bucket) == []


@pytest.mark.parametrize("way", ["UploadPartCopy", "streamed whole", "streamed in parts"])
def test_a_refused_tag_set_in_a_versioned_bucket_removes_only_the_version_written(
        tensorstream_s3: Any, way: str) -> None:
    """In a versioned bucket, the copy removed after its PutObjectTagging was refused was
    removed by key: a delete marker hid the object the destination held before (a 404
    where the user's model was), and the copy's version stayed under it. The version the
    copy wrote is removed now: what was there before is there again, and nothing more."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    b.client.put_bucket_versioning(Bucket=b.bucket,
                                   VersioningConfiguration={"Status": "Enabled"})
    b.client.put_object(Bucket=b.bucket, Key="t/v-src.bin", Body=os.urandom(size))
    b.client.put_object_tagging(Bucket=b.bucket, Key="t/v-src.bin",
                                Tagging={"TagSet": _LARGE})
    b.client.put_object(Bucket=b.bucket, Key="t/v-dst.bin", Body=b"before")
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]  # GetObjectTagging read, PutObjectTagging refused
    r = copy(b.uri("t/v-src.bin"), b.uri("t/v-dst.bin"), **b.options, **options)
    assert not r.ok and "removed" in r.errors[0], r.errors
    assert b.get("t/v-dst.bin") == b"before"
    listed = b.client.list_object_versions(Bucket=b.bucket, Prefix="t/v-dst.bin")
    assert listed.get("DeleteMarkers", []) == []
    assert [v["Size"] for v in listed.get("Versions", [])] == [len(b"before")]


def test_a_copy_refused_501_for_its_tags_leaves_copy_object_on_for_the_others(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An S3 Express directory bucket answers ``501 NotImplemented`` to a CopyObject that
    copies non-empty tags (its default, COPY), and only to that one. The 501 was taken
    for "no CopyObject here": every later object of the run was streamed through this
    machine. It is that object's alone now (streamed, as aws fails it rather than drop
    its tags), and the untagged objects after it are still copied by S3."""
    b = tensorstream_s3
    data = {"src/a.bin": os.urandom(1000), "src/b.bin": os.urandom(1000),
            "src/c.bin": os.urandom(1000)}
    for key, body in data.items():
        b.put(key, body)
    b.client.put_object_tagging(Bucket=b.bucket, Key="src/a.bin",
                                Tagging={"TagSet": [{"Key": "team", "Value": "ml"}]})
    b.faults.raw.path_prefix = f"/{b.bucket}/dst/"
    b.faults.raw.status_script = [501]  # the first request to dst/: a.bin's CopyObject
    with caplog.at_level(logging.WARNING, logger="tensorstream.copy"):
        r = copy(b.uri("src/"), b.uri("dst/"), recursive=True, jobs=1, **b.options)
    assert r.ok and r.files == 3, r.errors
    by = {o.dst.rsplit("/", 1)[-1]: o.server_side for o in r.outcomes}
    assert by == {"a.bin": False, "b.bin": True, "c.bin": True}, by
    said = [rec.getMessage() for rec in caplog.records if "through this machine" in
            rec.getMessage()]
    assert len(said) == 1 and "a.bin" in said[0] and "tags" in said[0], said
    for key, body in data.items():
        assert b.get(key.replace("src/", "dst/")) == body


@pytest.mark.parametrize("way", ["UploadPartCopy", "streamed whole", "streamed in parts"])
def test_a_refused_tag_set_in_a_suspended_bucket_removes_only_what_was_written(
        tensorstream_s3: Any, way: str) -> None:
    """In a bucket whose versioning is suspended, a write makes the ``null`` version; the
    copy removed after its PutObjectTagging was refused was removed by key, which on S3
    puts a delete marker in the ``null`` version's place and hides the version the key
    held before. It is removed by ``VersionId=null`` now where S3 named that version (a
    copy in parts: moto names it), else while the key holds the copy's ETag
    (``If-Match``). moto keeps one version of a key in a suspended bucket (a write there
    drops the earlier one), so the hidden version cannot be shown on it: the request is."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    b.client.put_bucket_versioning(Bucket=b.bucket,
                                   VersioningConfiguration={"Status": "Suspended"})
    b.client.put_object(Bucket=b.bucket, Key="t/s-src.bin", Body=os.urandom(size))
    b.client.put_object_tagging(Bucket=b.bucket, Key="t/s-src.bin",
                                Tagging={"TagSet": _LARGE})
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]  # GetObjectTagging read, PutObjectTagging refused
    b.proxy.clear_log()
    r = copy(b.uri("t/s-src.bin"), b.uri("t/s-dst.bin"), **b.options, **options)
    assert not r.ok and "removed" in r.errors[0], r.errors
    deletes = [q for q in b.requests if q.method == "DELETE"
               and q.path.split("?")[0] == f"/{b.bucket}/t/s-dst.bin" and "uploadId" not in q.path]
    assert len(deletes) == 1, [q.path for q in deletes]
    if way == "streamed whole":  # (moto names no version for a PutObject here)
        assert any(h.lower() == "if-match" for h in deletes[0].headers), deletes[0].headers
    else:
        assert "versionId=null" in deletes[0].path, deletes[0].path
    assert b.client.list_objects_v2(Bucket=b.bucket, Prefix="t/s-dst").get("Contents", []) == []


class _WriterBeforeDelete(LoopFront):
    """A front whose first DeleteObject of ``key`` comes after another writer stored
    ``other`` there (straight to moto): the race between a removal and a writer."""

    def __init__(self, upstream: str, client: Any, bucket: str, key: str,
                 other: bytes) -> None:
        super().__init__()
        self.upstream, self.client, self.bucket, self.key = upstream, client, bucket, key
        self.other, self.raced = other, 0

    async def _forward(self, request: Any) -> Any:
        import asyncio

        if (request.method == "DELETE" and request.path == f"/{self.bucket}/{self.key}"
                and "uploadId" not in request.query and not self.raced):
            self.raced += 1
            await asyncio.to_thread(self.client.put_object, Bucket=self.bucket, Key=self.key,
                                    Body=self.other)
        status, out, answer, length = await pass_on(request, self.upstream,
                                                    await request.read())
        return await send_back(request, status, out, answer, length)


def test_a_removal_never_deletes_another_writers_object_stored_since(
        tensorstream_s3: Any) -> None:
    """An unversioned bucket: the copy removed after its PutObjectTagging was refused was
    deleted by key, and another writer's object stored there since (between the refusal
    and the delete) went instead. The delete is conditional on the copy's ETag now
    (``If-Match``): S3 answers 412, the other writer's object stays, and the error says
    so."""
    b = tensorstream_s3
    options, size = _WAYS["streamed whole"]
    b.client.put_object(Bucket=b.bucket, Key="t/r-src.bin", Body=os.urandom(size))
    b.client.put_object_tagging(Bucket=b.bucket, Key="t/r-src.bin",
                                Tagging={"TagSet": _LARGE})
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]  # GetObjectTagging read, PutObjectTagging refused
    front = _WriterBeforeDelete(b.proxy.url, b.client, b.bucket, "t/r-dst.bin", b"theirs")
    with front as endpoint:
        r = copy(b.uri("t/r-src.bin"), b.uri("t/r-dst.bin"),
                 **{**b.options, "s3_endpoint": endpoint}, **options)
    assert front.raced == 1
    assert not r.ok and "another writer's object" in r.errors[0], r.errors
    assert b.get("t/r-dst.bin") == b"theirs"


class _NoConditionalDeletes(LoopFront):
    """A front answering ``501 NotImplemented`` to a DeleteObject with ``If-Match`` (a
    store without conditional deletes); every other request passed on."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream, self.refused = upstream, 0

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        if request.method == "DELETE" and "If-Match" in request.headers:
            self.refused += 1
            return web.Response(status=501, content_type="application/xml", body=(
                b"<Error><Code>NotImplemented</Code><Message>A header you provided implies "
                b"functionality that is not implemented</Message></Error>"))
        status, out, answer, length = await pass_on(request, self.upstream,
                                                    await request.read())
        return await send_back(request, status, out, answer, length)


def test_a_store_without_conditional_deletes_still_removes_the_copy(
        tensorstream_s3: Any) -> None:
    """The neighbour: a store that answers ``501`` to ``If-Match`` on DeleteObject gets
    the delete by key, as before (the race with another writer remains there)."""
    b = tensorstream_s3
    options, size = _WAYS["streamed whole"]
    b.client.put_object(Bucket=b.bucket, Key="t/n-src.bin", Body=os.urandom(size))
    b.client.put_object_tagging(Bucket=b.bucket, Key="t/n-src.bin",
                                Tagging={"TagSet": _LARGE})
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]  # GetObjectTagging read, PutObjectTagging refused
    front = _NoConditionalDeletes(b.proxy.url)
    with front as endpoint:
        r = copy(b.uri("t/n-src.bin"), b.uri("t/n-dst.bin"),
                 **{**b.options, "s3_endpoint": endpoint}, **options)
    assert front.refused == 1
    assert not r.ok and "the object was removed again" in r.errors[0], r.errors
    assert b.client.list_objects_v2(Bucket=b.bucket, Prefix="t/n-dst").get("Contents", []) == []
