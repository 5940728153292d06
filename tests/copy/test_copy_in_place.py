"""``cp s3://b/k s3://b/k --content-type/--cache-control/--metadata``: an object's
metadata changed in place, as ``aws s3 cp --metadata-directive REPLACE`` changes it (a
copy by S3 onto itself), and a clear error where that cannot be done. moto's server
behind the package's fault proxy, which records every request."""

from __future__ import annotations

import os
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from iam_users import iam_user_keys
from s3_encrypting_front import EncryptingFront
from s3_parts import put_in_parts
from tensorstream.copy.engine import copy
from tensorstream.providers.s3.metadata import MetadataOptions

MiB = 1 << 20


def _put_in_parts(backend: Any, key: str, parts: list[bytes]) -> str:
    return put_in_parts(backend, key, parts, ContentType="x-model/old",
                        CacheControl="no-cache", Metadata={"old": "1"})


def _head(backend: Any, key: str) -> dict[str, Any]:
    return dict(backend.client.head_object(Bucket=backend.bucket, Key=key))


def _writes(backend: Any, key: str) -> list[Any]:
    return [q for q in backend.requests if q.method in ("PUT", "POST")
            and q.path == f"/{backend.bucket}/{key}"]


def test_metadata_is_changed_in_place_by_one_copy_object(tensorstream_s3: Any) -> None:
    """``cp s3://b/k s3://b/k --content-type T --metadata k=v`` was refused ("source and
    destination are the same object"): aws s3 cp makes it a CopyObject onto itself with
    REPLACE. Now the same: the fields given replace the object's, the others are kept,
    the bytes never leave S3 and are the same after."""
    b = tensorstream_s3
    data = os.urandom(1000)
    b.client.put_object(Bucket=b.bucket, Key="m/k.json", Body=data, ContentType="text/plain",
                        CacheControl="max-age=60", Metadata={"old": "1"})
    etag = _head(b, "m/k.json")["ETag"]
    b.proxy.clear_log()
    r = copy(b.uri("m/k.json"), b.uri("m/k.json"), **b.options,
             object_metadata=MetadataOptions(content_type="application/json",
                                             metadata={"sha": "abc"}))
    assert r.ok and r.files == 1 and r.outcomes[0].server_side, r.errors
    assert r.outcomes[0].verified_by == "ETag"
    head = _head(b, "m/k.json")
    assert head["ContentType"] == "application/json" and head["Metadata"] == {"sha": "abc"}
    assert head["CacheControl"] == "max-age=60" and head["ETag"] == etag
    assert b.get("m/k.json") == data
    (put,) = _writes(b, "m/k.json")
    assert [q for q in b.requests if q.method == "GET" and q.path.endswith("/m/k.json")] == []
    assert put.method == "PUT"


def test_a_multipart_object_is_changed_in_place_in_its_own_parts(tensorstream_s3: Any) -> None:
    """An object uploaded in parts: copied onto itself part for part (its ETag, the copy's,
    compared before it is published), the new metadata on the upload; no upload left."""
    b = tensorstream_s3
    parts = [os.urandom(5 * MiB), b"end"]
    etag = _put_in_parts(b, "m/big.bin", parts)
    r = copy(b.uri("m/big.bin"), b.uri("m/big.bin"), **b.options,
             object_metadata=MetadataOptions(cache_control="max-age=3600"))
    assert r.ok and r.outcomes[0].server_side and r.outcomes[0].verified_by == "ETag", r.errors
    head = _head(b, "m/big.bin")
    assert head["CacheControl"] == "max-age=3600" and head["ContentType"] == "x-model/old"
    assert head["Metadata"] == {"old": "1"} and head["ETag"] == etag
    assert b.get("m/big.bin") == b"".join(parts)
    assert b.server.open_multipart_uploads(b.bucket) == []


def test_a_prefix_is_changed_in_place(tensorstream_s3: Any) -> None:
    """``cp -r s3://b/p/ s3://b/p/ --metadata k=v`` (aws's recursive REPLACE): every object."""
    b = tensorstream_s3
    for name in ("a.bin", "sub/b.bin"):
        b.put(f"p/{name}", name.encode())
    r = copy(b.uri("p/"), b.uri("p/"), recursive=True, **b.options,
             object_metadata=MetadataOptions(metadata={"team": "ml"}))
    assert r.ok and r.files == 2, r.errors
    for name in ("a.bin", "sub/b.bin"):
        assert _head(b, f"p/{name}")["Metadata"] == {"team": "ml"}
        assert b.get(f"p/{name}") == name.encode()


def test_without_metadata_an_object_onto_itself_is_still_refused(tensorstream_s3: Any) -> None:
    """No field given: nothing would change (S3 refuses such a copy too): still refused,
    and the error says how to change the metadata in place."""
    b = tensorstream_s3
    b.put("m/k.bin", b"k")
    b.proxy.clear_log()
    r = copy(b.uri("m/k.bin"), b.uri("m/k.bin"), **b.options)
    assert not r.ok and "same object" in r.errors[0], r.errors
    assert "--metadata" in r.errors[0] and "--content-type" in r.errors[0], r.errors
    assert _writes(b, "m/k.bin") == []


@pytest.mark.tensorstream_s3(auth=False)  # (the SSE-C front maps ETags back: no signature)
@pytest.mark.parametrize("how", ["no server-side copy", "another key pair",
                                 "not implemented", "SSE-C"])
def test_where_s3_cannot_copy_onto_itself_a_clear_error_and_the_object_untouched(
        tensorstream_s3: Any, how: str) -> None:
    """The change is a copy by S3 onto itself; where there is none (--no-server-side-copy,
    a key pair per side, a store answering 501, a source encrypted with a customer key) the
    object is never streamed onto itself: an error says why and what to do, nothing is
    written."""
    b = tensorstream_s3
    data = os.urandom(1000)
    b.client.put_object(Bucket=b.bucket, Key="m/k.bin", Body=data, ContentType="x/old")
    kwargs: dict[str, Any] = dict(b.options)
    if how == "no server-side copy":
        kwargs["server_side_copy"] = False
    elif how == "another key pair":
        kwargs = {"src_options": b.options,
                  "dst_options": {**b.options, "s3_session_token": "another"}}
    elif how == "not implemented":
        b.faults.raw.path_prefix = f"/{b.bucket}/m/k.bin"
        b.faults.raw.status_script = [200, 200, 501]  # planning's HEAD, the copy's, the copy
    front = EncryptingFront(b.proxy.url, {"x-amz-server-side-encryption-customer-algorithm":
                                          "AES256"}, prefix=f"/{b.bucket}/m/k.bin")
    if how == "SSE-C":
        kwargs["s3_endpoint"] = front.__enter__().url
    b.proxy.clear_log()
    try:
        r = copy(b.uri("m/k.bin"), b.uri("m/k.bin"), **kwargs,
                 object_metadata=MetadataOptions(content_type="x/new"))
    finally:
        if how == "SSE-C":
            front.__exit__()
    assert not r.ok and r.files == 0, r.errors
    assert "in place" in r.errors[0], r.errors
    said = {"no server-side copy": "--no-server-side-copy", "another key pair": "key pair",
            "not implemented": "NotImplemented", "SSE-C": "SSE-C"}[how]
    assert said in r.errors[0], r.errors
    assert _head(b, "m/k.bin")["ContentType"] == "x/old" and b.get("m/k.bin") == data


@pytest.mark.parametrize("how", ["sync", "cp -r --resume"])
def test_an_in_place_change_under_sync_or_resume_is_made_once(tensorstream_s3: Any,
                                                               how: str) -> None:
    """``sync``/``cp -r --resume`` of a prefix onto itself with ``--content-type`` (or
    ``--metadata``): every object is its own copy, so every one was skipped as unchanged and
    nothing was changed, without a word. Now an object onto itself is judged by the fields
    given: one that does not hold them yet is changed in place, one that does is skipped
    (the next run sends no copy)."""
    b = tensorstream_s3
    b.client.put_object(Bucket=b.bucket, Key="m/a.json", Body=b"{}", ContentType="text/plain",
                        Metadata={"old": "1"})
    b.client.put_object(Bucket=b.bucket, Key="m/b.json", Body=b"[]",
                        ContentType="application/json", Metadata={"sha": "abc"})
    kind = {"skip_unchanged": True} if how == "sync" else {"resume": True}
    meta = MetadataOptions(content_type="application/json", metadata={"sha": "abc"})

    def run() -> dict[str, str]:
        r = copy(b.uri("m/"), b.uri("m/"), recursive=True, **kind, **b.options,
                 object_metadata=meta)
        assert r.ok, r.errors
        return {o.src.rsplit("/", 1)[-1]: o.status for o in r.outcomes}

    assert run() == {"a.json": "copied", "b.json": "skipped"}
    head = _head(b, "m/a.json")
    assert head["ContentType"] == "application/json" and head["Metadata"] == {"sha": "abc"}
    assert b.get("m/a.json") == b"{}"
    b.proxy.clear_log()
    assert run() == {"a.json": "skipped", "b.json": "skipped"}
    assert [q for q in b.requests if q.method in ("PUT", "POST")] == []


def test_an_in_place_change_of_user_metadata_alone_is_judged_by_it(tensorstream_s3: Any) -> None:
    """The neighbour: only ``--metadata`` given, the object's other fields differing from
    nothing given: an object whose user metadata is other is changed, whatever its type."""
    b = tensorstream_s3
    b.client.put_object(Bucket=b.bucket, Key="m/a.bin", Body=b"a", Metadata={"sha": "old"})
    r = copy(b.uri("m/"), b.uri("m/"), recursive=True, skip_unchanged=True, **b.options,
             object_metadata=MetadataOptions(metadata={"sha": "new"}))
    assert r.ok and [o.status for o in r.outcomes] == ["copied"], r.errors
    assert _head(b, "m/a.bin")["Metadata"] == {"sha": "new"}


_KEPT = {"StorageClass": "STANDARD_IA", "ServerSideEncryption": "aws:kms",
         "SSEKMSKeyId": "a-key-of-its-own", "WebsiteRedirectLocation": "/elsewhere"}
_TAGS = [{"Key": "team", "Value": "ml"}, {"Key": "keep", "Value": "a b+c"}]


@pytest.mark.parametrize("in_parts", [False, True])
def test_an_object_changed_in_place_keeps_its_class_encryption_and_tags(
        tensorstream_s3: Any, in_parts: bool) -> None:
    """A copy request onto itself sets the storage class (STANDARD) and the encryption
    (the bucket's default) anew where they are not sent: a change of Content-Type turned
    an STANDARD_IA object under a KMS key of its own into a STANDARD one under SSE-S3; one
    changed in parts (a new upload) lost its tags too."""
    b = tensorstream_s3
    data = os.urandom(6 * MiB)
    b.client.put_object(Bucket=b.bucket, Key="m/kept.bin", Body=data, ContentType="x/old",
                        Tagging="team=ml&keep=a%20b%2Bc", **_KEPT)
    cutoff = {"copy_cutoff": 5 * MiB, "part_size": 5 * MiB} if in_parts else {}
    r = copy(b.uri("m/kept.bin"), b.uri("m/kept.bin"), **b.options, **cutoff,
             object_metadata=MetadataOptions(content_type="x/new"))
    assert r.ok and r.outcomes[0].server_side, r.errors
    head = _head(b, "m/kept.bin")
    assert head["ContentType"] == "x/new"
    assert {k: head.get(k) for k in _KEPT} == _KEPT
    assert b.client.get_object_tagging(Bucket=b.bucket, Key="m/kept.bin")["TagSet"] == _TAGS
    assert b.get("m/kept.bin") == data
    assert b.server.open_multipart_uploads(b.bucket) == []
    # The neighbour: a copy to another key is stored as the bucket says (as aws s3 cp's).
    r = copy(b.uri("m/kept.bin"), b.uri("m/other.bin"), **b.options, **cutoff)
    assert r.ok, r.errors
    head = _head(b, "m/other.bin")
    assert head.get("StorageClass") is None and head.get("SSEKMSKeyId") is None


def test_an_object_whose_tags_cannot_be_read_is_not_changed_in_parts(moto_s3: Any) -> None:
    """A key that may not read the object's tags: the change in parts (a new upload) would
    drop them, so it is refused naming the permission, nothing changed and no upload left.
    The neighbour: one CopyObject (S3 keeps the tags itself) still changes it."""
    key = f"in-place-{os.urandom(4).hex()}/t.bin"
    uri = f"s3://{S3_BUCKET}/{key}"
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=key, Body=os.urandom(6 * MiB),
                              ContentType="x/old", Tagging="team=ml")
    options = moto_s3.options(**iam_user_keys(moto_s3, "tagless", [
        {"Effect": "Allow", "Action": "s3:*",
         "Resource": [f"arn:aws:s3:::{S3_BUCKET}", f"arn:aws:s3:::{S3_BUCKET}/*"]},
        {"Effect": "Deny", "Action": "s3:GetObjectTagging",
         "Resource": f"arn:aws:s3:::{S3_BUCKET}/*"}]))
    new = MetadataOptions(content_type="x/new")
    r = copy(uri, uri, copy_cutoff=5 * MiB, part_size=5 * MiB, object_metadata=new, **options)
    assert not r.ok and len(r.errors) == 1, r.errors
    assert "s3:GetObjectTagging" in r.errors[0] and "nothing was changed" in r.errors[0]
    assert moto_s3.client.head_object(Bucket=S3_BUCKET, Key=key)["ContentType"] == "x/old"
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []
    r = copy(uri, uri, object_metadata=new, **options)
    assert r.ok, r.errors
    assert moto_s3.client.head_object(Bucket=S3_BUCKET, Key=key)["ContentType"] == "x/new"
    tags = moto_s3.client.get_object_tagging(Bucket=S3_BUCKET, Key=key)["TagSet"]
    assert tags == [{"Key": "team", "Value": "ml"}]


def test_a_store_without_tags_still_changes_an_object_in_parts(tensorstream_s3: Any) -> None:
    """A store that has no object tags (R2 answers GetObjectTagging 501 NotImplemented)
    holds none to keep: the change in parts is made, not refused."""
    b = tensorstream_s3
    data = os.urandom(6 * MiB)
    b.put("m/untagged.bin", data)
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [501]
    r = copy(b.uri("m/untagged.bin"), b.uri("m/untagged.bin"), **b.options,
             copy_cutoff=5 * MiB, part_size=5 * MiB,
             object_metadata=MetadataOptions(content_type="x/new"))
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert [q.status for q in b.requests if q.path.endswith("?tagging")] == [501]
    assert _head(b, "m/untagged.bin")["ContentType"] == "x/new"
    assert b.get("m/untagged.bin") == data


def test_an_object_changed_in_place_in_parts_keeps_a_tag_set_too_large_for_a_header(
        tensorstream_s3: Any) -> None:
    """S3's largest tag set on an object changed in parts onto itself: sent with the
    upload in an 11 KB header, the change failed (400); set after it now. Refused then
    (403), the object is not removed (it is the only one): the error says it is there,
    changed, without its tags."""
    b = tensorstream_s3
    tags = [{"Key": f"{i}" + "k" * 127, "Value": "é" * 256} for i in range(10)]
    data = os.urandom(6 * MiB)
    for key in ("m/large.bin", "m/refused.bin"):
        b.client.put_object(Bucket=b.bucket, Key=key, Body=data, ContentType="x/old")
        b.client.put_object_tagging(Bucket=b.bucket, Key=key, Tagging={"TagSet": tags})
    new = MetadataOptions(content_type="x/new")
    cutoff = {"copy_cutoff": 5 * MiB, "part_size": 5 * MiB}
    r = copy(b.uri("m/large.bin"), b.uri("m/large.bin"), **b.options, **cutoff,
             object_metadata=new)
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert _head(b, "m/large.bin")["ContentType"] == "x/new"
    assert b.client.get_object_tagging(Bucket=b.bucket, Key="m/large.bin")["TagSet"] == tags
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]
    r = copy(b.uri("m/refused.bin"), b.uri("m/refused.bin"), **b.options, **cutoff,
             object_metadata=new)
    assert not r.ok and len(r.errors) == 1, r.errors
    assert "its 10 tags" in r.errors[0] and "it is the object itself" in r.errors[0], r.errors
    assert _head(b, "m/refused.bin")["ContentType"] == "x/new"
    assert b.get("m/refused.bin") == data
    assert b.server.open_multipart_uploads(b.bucket) == []
