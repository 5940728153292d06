"""``cp``/``sync --copy-props`` (``copy_props`` of
:class:`~tensorstream.providers.s3.metadata.MetadataOptions`), as ``aws s3 cp``'s: what
an S3 -> S3 copy carries from its source, on every way a copy is made (one CopyObject,
UploadPartCopy in parts, streamed whole or in parts, changed in place). moto's server
behind the package's fault proxy, which records every request."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cli_env import cli
from fixtures_s3 import S3_BUCKET
from iam_users import iam_user_keys
from tensorstream.copy.engine import copy
from tensorstream.errors import ConfigurationError
from tensorstream.providers.s3.metadata import MetadataOptions

MiB = 1 << 20
_FIELDS = {"ContentType": "x/model", "CacheControl": "max-age=60",
           "ContentLanguage": "en", "ContentDisposition": "inline",
           "Metadata": {"origin": "lab"}}
#: (copy options, size): as in test_copy_tags.py.
_WAYS = {
    "CopyObject": ({}, 1 * MiB),
    "UploadPartCopy": ({"copy_cutoff": 5 * MiB, "part_size": 5 * MiB}, 6 * MiB),
    "streamed whole": ({"server_side_copy": False}, 1 * MiB),
    "streamed in parts": ({"server_side_copy": False, "part_size": 5 * MiB}, 6 * MiB),
    "in place": ({}, 1 * MiB),
    "in place in parts": ({"copy_cutoff": 5 * MiB, "part_size": 5 * MiB}, 6 * MiB),
}
_PROPS = ["default", "metadata-directive", "none"]


def _held(b: Any, key: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    head = b.client.head_object(Bucket=b.bucket, Key=key)
    tags = b.client.get_object_tagging(Bucket=b.bucket, Key=key)["TagSet"]
    return {k: head.get(k) for k in _FIELDS}, list(tags)


@pytest.mark.parametrize("props", _PROPS)
@pytest.mark.parametrize("way", list(_WAYS))
def test_copy_props_chooses_what_a_copy_carries(tensorstream_s3: Any, way: str,
                                                props: str) -> None:
    """``default`` carries the source's fields and tags (as before); ``metadata-directive``
    its fields and no tags, asking S3 for none (no GetObjectTagging); ``none`` nothing of
    it: a type guessed from the name and what the caller sets. Bytes as the source's."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    data = os.urandom(size)
    b.client.put_object(Bucket=b.bucket, Key="p/model.json", Body=data, Tagging="team=ml",
                        **_FIELDS)
    in_place = way.startswith("in place")
    dst = "p/model.json" if in_place else "p/copy.json"
    # (in place, S3 takes a copy onto itself only with a field set)
    meta = MetadataOptions(copy_props=props, metadata={"set": "here"} if in_place else None)
    b.proxy.clear_log()
    r = copy(b.uri("p/model.json"), b.uri(dst), **b.options, **options, object_metadata=meta)
    assert r.ok, r.errors
    assert r.outcomes[0].server_side == ("streamed" not in way)
    assert b.get(dst) == data
    fields, tags = _held(b, dst)
    source_meta = {"set": "here"} if in_place else _FIELDS["Metadata"]
    if props == "none":
        assert fields == {"ContentType": "application/json", "CacheControl": None,
                          "ContentLanguage": None, "ContentDisposition": None,
                          "Metadata": {"set": "here"} if in_place else {}}
    else:
        assert fields == {**_FIELDS, "Metadata": source_meta}
    assert tags == ([{"Key": "team", "Value": "ml"}] if props == "default" else [])
    asked = [q for q in b.requests if "tagging" in q.path]
    assert bool(asked) == (props == "default" and way not in ("CopyObject", "in place")), asked
    assert b.server.open_multipart_uploads(b.bucket) == []


@pytest.mark.parametrize("props", _PROPS)
def test_copy_props_under_sync_in_place_is_not_skipped_for_the_fields(tensorstream_s3: Any,
                                                                      props: str) -> None:
    """``sync`` of a prefix onto itself skips an object that already holds the fields
    given; with ``none``/``metadata-directive`` it was skipped too and kept its tags, which
    were asked away. Only a GetObjectTagging (what these values spare) shows them: such an
    object is changed in place every run; ``default`` still skips it."""
    b = tensorstream_s3
    b.client.put_object(Bucket=b.bucket, Key="s/a.json", Body=b"{}", Tagging="t=1",
                        ContentType="application/json", Metadata={"set": "here"})
    meta = MetadataOptions(copy_props=props, metadata={"set": "here"})
    r = copy(b.uri("s/"), b.uri("s/"), recursive=True, skip_unchanged=True, **b.options,
             object_metadata=meta)
    assert r.ok, r.errors
    assert [o.status for o in r.outcomes] == ["skipped" if props == "default" else "copied"]
    assert _held(b, "s/a.json")[1] == ([{"Key": "t", "Value": "1"}] if props == "default"
                                       else [])
    assert b.get("s/a.json") == b"{}"


@pytest.mark.parametrize("props", _PROPS)
def test_copy_props_none_sends_no_head_for_metadata(tensorstream_s3: Any, props: str) -> None:
    """A listing says nothing of an object's metadata: a streamed copy of a prefix HEADs
    each object for it, and reads its tags, unless ``none`` carries nothing of it."""
    b = tensorstream_s3
    for name in ("a.json", "b.json"):
        b.client.put_object(Bucket=b.bucket, Key=f"d/{name}", Body=b"{}", Tagging="t=1",
                            **_FIELDS)
    b.proxy.clear_log()
    r = copy(b.uri("d/"), b.uri("e/"), recursive=True, server_side_copy=False, **b.options,
             object_metadata=MetadataOptions(copy_props=props))
    assert r.ok and len(r.outcomes) == 2, r.errors
    heads = [q.path for q in b.requests if q.method == "HEAD" and "/d/" in q.path]
    tagging = [q.path for q in b.requests if q.path.endswith("?tagging")]
    assert (len(heads), len(tagging)) == {"default": (2, 2), "metadata-directive": (2, 0),
                                          "none": (0, 0)}[props], (heads, tagging)
    fields, tags = _held(b, "e/a.json")
    assert fields["ContentType"] == ("application/json" if props == "none" else "x/model")
    assert tags == ([{"Key": "t", "Value": "1"}] if props == "default" else [])


@pytest.mark.parametrize("props", ["metadata-directive", "none"])
@pytest.mark.parametrize("way", ["CopyObject", "UploadPartCopy", "streamed whole",
                                 "streamed in parts", "in place in parts"])
def test_copy_props_copies_what_tags_that_cannot_be_read_refused(
        moto_s3: Any, way: str, props: str) -> None:
    """A key pair without s3:GetObjectTagging on the source could not copy an object in
    parts or streamed at all (default keeps the tags and must read them); without tags
    (``metadata-directive``, ``none``) it copies every way, and the refusal of the default
    names --copy-props."""
    prefix = f"props-{os.urandom(4).hex()}"
    options, size = _WAYS[way]
    data = os.urandom(size)
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/src.bin", Body=data,
                              Tagging="team=ml", ContentType="x/model")
    keys = moto_s3.options(**iam_user_keys(moto_s3, "no-tags-props", [
        {"Effect": "Allow", "Action": "s3:*",
         "Resource": [f"arn:aws:s3:::{S3_BUCKET}", f"arn:aws:s3:::{S3_BUCKET}/*"]},
        {"Effect": "Deny", "Action": "s3:GetObjectTagging",
         "Resource": f"arn:aws:s3:::{S3_BUCKET}/*"}]))
    in_place = way == "in place in parts"
    name = "src.bin" if in_place else "dst.bin"
    src, dst = f"s3://{S3_BUCKET}/{prefix}/src.bin", f"s3://{S3_BUCKET}/{prefix}/{name}"
    given = {"metadata": {"set": "here"}} if in_place else {}
    if way != "CopyObject":
        r = copy(src, dst, **keys, **options, object_metadata=MetadataOptions(**given))
        assert not r.ok and "--copy-props metadata-directive" in r.errors[0], r.errors
        assert ("nothing was changed" if in_place else "nothing was copied") in r.errors[0]
    r = copy(src, dst, **keys, **options,
             object_metadata=MetadataOptions(copy_props=props, **given))
    assert r.ok, r.errors
    got = moto_s3.client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/{name}")
    assert got["Body"].read() == data
    assert got["ContentType"] == ("x/model" if props == "metadata-directive"
                                  else "application/octet-stream")  # (guessed from .bin)
    tags = moto_s3.client.get_object_tagging(Bucket=S3_BUCKET, Key=f"{prefix}/{name}")
    assert tags["TagSet"] == []


@pytest.mark.parametrize("src, dst, side", [
    ("{local}", "s3://b/k", "the source is local"),
    ("s3://b/k", "{local}", "the destination is local"),
    ("http://example.invalid/k", "s3://b/k", "the source is http"),
])
@pytest.mark.parametrize("props", ["metadata-directive", "none"])
def test_copy_props_where_a_side_is_not_s3_is_refused(tmp_path: Any, src: str, dst: str,
                                                       side: str, props: str) -> None:
    """aws ignores --copy-props where a side is not S3; here it is refused before anything
    is sent, naming the side. ``default`` (what happens anyway) is taken."""
    (tmp_path / "f").write_bytes(b"x")
    src, dst = (s.format(local=tmp_path / "f") for s in (src, dst))
    with pytest.raises(ConfigurationError, match=f"--copy-props {props} .*{side}"):
        copy(src, dst, object_metadata=MetadataOptions(copy_props=props))
    r = copy(str(tmp_path / "f"), str(tmp_path / "g"),
             object_metadata=MetadataOptions(copy_props="default"))
    assert r.ok and (tmp_path / "g").read_bytes() == b"x"


def test_copy_props_takes_three_values() -> None:
    with pytest.raises(ConfigurationError, match="'none', 'metadata-directive', 'default'"):
        MetadataOptions(copy_props="metadata")


def test_cli_copy_props_parsing(tmp_path: Any) -> None:
    """An invalid value is a usage error listing the three; a value refused for a local
    side (cp and sync, and cp - DST) is a usage error too, nothing copied."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    for verb in ("cp", "sync"):
        r = cli(verb, "--copy-props", "tags", str(tmp_path / "d") + "/", "s3://b/p/")
        assert r.returncode == 2, r.stderr
        assert "'none', 'metadata-directive', 'default'" in r.stderr
        r = cli(verb, "-r", "--copy-props", "none", str(tmp_path / "d") + "/", "s3://b/p/") \
            if verb == "cp" else cli(verb, "--copy-props", "none", str(tmp_path / "d") + "/",
                                     "s3://b/p/")
        assert r.returncode == 2 and "the source is local" in r.stderr, r.stderr
    r = cli("cp", "--copy-props", "metadata-directive", "-", "s3://b/k", input="x")
    assert r.returncode == 2 and "the source is stdin" in r.stderr, r.stderr
    r = cli("cp", "--copy-props", "default", str(tmp_path / "d" / "f"), str(tmp_path / "g"))
    assert r.returncode == 0 and (tmp_path / "g").read_bytes() == b"x", r.stderr


@pytest.mark.parametrize("props", _PROPS)
@pytest.mark.parametrize("way", ["in place", "in place in parts"])
def test_copy_props_alone_changes_an_object_in_place(tensorstream_s3: Any, way: str,
                                                     props: str) -> None:
    """``cp s3://b/k s3://b/k --copy-props none`` (or ``metadata-directive``) with no field
    given: aws s3 cp sends the copy (MetadataDirective and TaggingDirective REPLACE) and S3
    changes the object in place, its tags (and with ``none`` its fields) dropped; it was
    refused as a copy onto itself. ``default`` with no field changes nothing and is still
    refused, as before."""
    b = tensorstream_s3
    options, size = _WAYS[way]
    data = os.urandom(size)
    b.client.put_object(Bucket=b.bucket, Key="q/model.json", Body=data, Tagging="team=ml",
                        **_FIELDS)
    r = copy(b.uri("q/model.json"), b.uri("q/model.json"), **b.options, **options,
             object_metadata=MetadataOptions(copy_props=props))
    fields, tags = _held(b, "q/model.json")
    assert b.get("q/model.json") == data
    if props == "default":
        assert not r.ok and "same object" in r.errors[0], r.errors
        assert (fields, tags) == (_FIELDS, [{"Key": "team", "Value": "ml"}])
        return
    assert r.ok and r.outcomes[0].server_side, r.errors
    assert tags == []
    assert fields == (_FIELDS if props == "metadata-directive" else {
        "ContentType": "application/json", "CacheControl": None, "ContentLanguage": None,
        "ContentDisposition": None, "Metadata": {}})
