"""S3 keys are at most 1024 bytes of UTF-8 (src/tensorstream/providers/s3/key_limit.py).

moto, like some S3-compatible stores, stores a longer key where real S3 answers
``KeyTooLongError`` once the request carries it (after a multipart upload has begun):
a write refuses such a key itself, before a byte moves, naming the key (shortened,
escaped) and the limit. Real moto on loopback; the copy engine in-process."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream import open as ts_open
from tensorstream.copy.engine import copy


def _prefix() -> str:
    return f"keylen-{secrets.token_hex(4)}"


def _key(prefix: str, size: int) -> str:
    """A key of exactly ``size`` UTF-8 bytes under ``prefix/``, two-byte characters in it."""
    head = f"{prefix}/" + "é" * 200
    return head + "k" * (size - len(head.encode()))


def _keys(server: Any, prefix: str) -> list[str]:
    out = []
    for page in server.client.get_paginator("list_objects_v2").paginate(
            Bucket=S3_BUCKET, Prefix=prefix + "/"):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def _nothing_under(server: Any, prefix: str) -> None:
    assert _keys(server, prefix) == []
    assert server.open_multipart_uploads(S3_BUCKET, prefix) == []


def test_an_upload_to_a_key_of_1025_bytes_is_refused_before_a_byte_moves(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp big.bin s3://b/<1025 bytes>`` uploaded it (moto took it; S3 refuses it after
    the upload began): refused, naming the limit and the key shortened, nothing stored."""
    prefix = _prefix()
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * (6 << 20))  # over the part size: a multipart upload
    key = _key(prefix, 1025)
    r = copy(str(src), f"s3://{S3_BUCKET}/{key}", part_size=5 << 20, **moto_s3.options())
    assert not r.ok and len(r.errors) == 1
    msg = str(r.errors[0])
    assert "S3 keys are at most 1024 bytes (UTF-8)" in msg and "is 1025 bytes" in msg
    assert "..." in msg and len(msg) < 600  # the key is shortened, not repeated whole
    _nothing_under(moto_s3, prefix)


def test_a_key_of_exactly_1024_bytes_is_uploaded(tmp_path: Path, moto_s3: Any) -> None:
    """The neighbour: 1024 bytes (two-byte characters counted as two) is S3's limit, taken."""
    prefix = _prefix()
    src = tmp_path / "f.bin"
    src.write_bytes(b"exact")
    key = _key(prefix, 1024)
    r = copy(str(src), f"s3://{S3_BUCKET}/{key}", **moto_s3.options())
    assert r.ok, r.errors
    assert moto_s3.get(S3_BUCKET, key) == b"exact"


@pytest.mark.parametrize("sync", [False, True], ids=["cp-r", "sync"])
def test_a_local_name_under_a_long_prefix_is_refused_by_name_and_the_rest_copied(
        tmp_path: Path, moto_s3: Any, sync: bool) -> None:
    """``cp -r``/``sync`` of a directory under a long prefix: the one file whose key would
    pass 1024 bytes is refused by name (its destination key is not written), the others
    are copied, as with any object refused while planning."""
    prefix = _prefix()
    dest = _key(prefix, 1000)  # 24 bytes left for 'NAME' after its '/'
    d = tmp_path / "d"
    d.mkdir()
    (d / "short.bin").write_bytes(b"s")
    (d / ("long-" + "n" * 30 + ".bin")).write_bytes(b"l")
    r = copy(str(d) + "/", f"s3://{S3_BUCKET}/{dest}/", recursive=True,
             skip_unchanged=sync, **moto_s3.options())
    assert len(r.errors) == 1
    assert "S3 keys are at most 1024 bytes" in str(r.errors[0])
    assert _keys(moto_s3, prefix) == [f"{dest}/short.bin"]


def test_an_s3_to_s3_copy_onto_a_long_key_is_refused(moto_s3: Any) -> None:
    """The copy by S3 (``CopyObject``) is refused the same way; the source is untouched."""
    prefix = _prefix()
    moto_s3.put(S3_BUCKET, f"{prefix}/src/a.bin", b"a")
    dest = _key(prefix, 1020)
    r = copy(f"s3://{S3_BUCKET}/{prefix}/src/", f"s3://{S3_BUCKET}/{dest}/", recursive=True,
             **moto_s3.options())
    assert len(r.errors) == 1 and "S3 keys are at most 1024 bytes" in str(r.errors[0])
    assert _keys(moto_s3, prefix) == [f"{prefix}/src/a.bin"]


def test_a_streamed_write_to_a_long_key_is_refused_at_open(moto_s3: Any) -> None:
    """``tensorstream.open(s3://b/<1025 bytes>, "wb")`` (``save_*`` write through it):
    an InvalidURIError at open, before a write; at 1024 bytes it writes."""
    prefix = _prefix()
    with pytest.raises(errors.InvalidURIError, match=r"at most 1024 bytes .* is 1025 bytes"):
        ts_open(f"s3://{S3_BUCKET}/{_key(prefix, 1025)}", "wb", **moto_s3.options())
    _nothing_under(moto_s3, prefix)
    with ts_open(f"s3://{S3_BUCKET}/{_key(prefix, 1024)}", "wb", **moto_s3.options()) as f:
        f.write(b"ok")
    assert moto_s3.get(S3_BUCKET, _key(prefix, 1024)) == b"ok"
