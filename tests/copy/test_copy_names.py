"""Object names as hostile input across backends: what a key may be depends on where it
lands. A filesystem takes no control characters or backslashes from a listing (nor
``..``); S3 and Redis store such keys as they are, so a copy between them keeps them.
Real moto and redis-server on loopback; the engine in-process, as ``tensorstream.copy``
is called."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream import open as ts_open
from tensorstream.copy.engine import copy

#: Keys S3 and Redis hold and a filesystem is not given: a backslash (Windows tools
#: upload ``dir\\file``), a tab, an escape sequence, DEL.
REMOTE_ONLY = ["win\\dir\\w.bin", "tab\there.bin", "esc\x1b[31m.bin", "del\x7f.bin"]


def _prefix() -> str:
    return f"names-{secrets.token_hex(4)}"


def _s3_keys(server: Any, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in server.client.get_paginator("list_objects_v2").paginate(
            Bucket=S3_BUCKET, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = server.get(S3_BUCKET, o["Key"])
    return out


def test_s3_to_s3_keeps_keys_a_filesystem_would_refuse(moto_s3: Any) -> None:
    """``cp -r s3://b/p/ s3://b/q/`` refused ``win\\dir\\w.bin`` and a key with a tab as
    "unsafe" (a rule for local files), exit 3: S3 holds them, as aws s3 cp copies them."""
    src, dst = _prefix(), _prefix()
    names = [*REMOTE_ONLY, "plain.bin"]
    for i, name in enumerate(names):
        moto_s3.put(S3_BUCKET, f"{src}/{name}", b"x" * i)
    r = copy(f"s3://{S3_BUCKET}/{src}/", f"s3://{S3_BUCKET}/{dst}/", recursive=True,
             **moto_s3.options())
    assert r.ok, r.errors
    assert _s3_keys(moto_s3, dst) == {name: b"x" * i for i, name in enumerate(names)}


def test_s3_to_redis_and_back_keeps_the_keys(moto_s3: Any, redis_server: Any) -> None:
    """S3 -> Redis -> S3 gives the same keys and bytes (Redis keys are bytes)."""
    src, mid, back = _prefix(), _prefix(), _prefix()
    for i, name in enumerate(REMOTE_ONLY):
        moto_s3.put(S3_BUCKET, f"{src}/{name}", b"y" * (i + 1))
    r = copy(f"s3://{S3_BUCKET}/{src}/", redis_server.url(f"{mid}/"), recursive=True,
             **moto_s3.options())
    assert r.ok, r.errors
    with redis_server.client() as c:
        assert {k.decode() for k in c.scan_iter(match=f"{mid}/*")} >= {
            f"{mid}/{n}" for n in REMOTE_ONLY}
    r = copy(redis_server.url(f"{mid}/"), f"s3://{S3_BUCKET}/{back}/", recursive=True,
             **moto_s3.options())
    assert r.ok, r.errors
    assert _s3_keys(moto_s3, back) == {n: b"y" * (i + 1) for i, n in enumerate(REMOTE_ONLY)}


@pytest.mark.parametrize("name", REMOTE_ONLY)
def test_the_same_keys_onto_a_filesystem_are_refused_by_name(
        tmp_path: Path, moto_s3: Any, name: str) -> None:
    """The neighbour: into a local directory each such key is still refused, named, and
    nothing is written for it (the others are copied)."""
    src = _prefix()
    moto_s3.put(S3_BUCKET, f"{src}/{name}", b"bad")
    moto_s3.put(S3_BUCKET, f"{src}/ok.bin", b"ok")
    out = tmp_path / "out"
    r = copy(f"s3://{S3_BUCKET}/{src}/", str(out) + "/", recursive=True, **moto_s3.options())
    assert not r.ok and len(r.errors) == 1
    assert repr(name) in r.errors[0]
    assert sorted(p.name for p in out.iterdir()) == ["ok.bin"]


@pytest.mark.parametrize("bad", ["..", ".", "a//b", "../up.bin"])
def test_dot_segments_and_empty_segments_are_refused_everywhere(
        moto_s3: Any, redis_server: Any, bad: str) -> None:
    """``..``, ``.`` and empty segments name another place (URL handling folds them), so
    they stay refused into S3 and Redis too, named, and nothing is written."""
    src, dst = _prefix(), _prefix()
    moto_s3.put(S3_BUCKET, f"{src}/{bad}", b"bad")
    for to in (f"s3://{S3_BUCKET}/{dst}/", redis_server.url(f"{dst}/")):
        r = copy(f"s3://{S3_BUCKET}/{src}/", to, recursive=True, **moto_s3.options())
        assert not r.ok and "segment" in r.errors[0], r.errors
    assert _s3_keys(moto_s3, dst) == {}
    with redis_server.client() as c:
        assert list(c.scan_iter(match=f"{dst}*")) == []


@pytest.mark.parametrize("name", ["..", ".", "tab\there.bin", "win\\w.bin"])
def test_one_object_given_a_destination_name_is_copied_under_that_name(
        tmp_path: Path, moto_s3: Any, redis_server: Any, name: str) -> None:
    """``cp 's3://b/p/..' out/dotdot``: the destination is named, so the source's name
    (which no file could have) does not matter; it was refused as "a '..' segment"."""
    src = _prefix()
    moto_s3.put(S3_BUCKET, f"{src}/{name}", b"named")
    uri = f"s3://{S3_BUCKET}/{src}/{name}"
    r = copy(uri, str(tmp_path / "given.bin"), **moto_s3.options())
    assert r.ok, r.errors
    assert (tmp_path / "given.bin").read_bytes() == b"named"
    r = copy(uri, redis_server.url(f"{src}/given.bin"), **moto_s3.options())
    assert r.ok, r.errors
    with ts_open(redis_server.url(f"{src}/given.bin")) as f:
        assert f.read() == b"named"


def test_one_object_into_a_directory_by_a_name_no_file_has_says_to_name_it(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp 's3://b/p/..' out/``: refused, and the error says how to copy it anyway."""
    src = _prefix()
    moto_s3.put(S3_BUCKET, f"{src}/..", b"x")
    r = copy(f"s3://{S3_BUCKET}/{src}/..", str(tmp_path) + "/", **moto_s3.options())
    assert not r.ok
    assert "'..' segment" in r.errors[0] and "name the destination" in r.errors[0]
    assert list(tmp_path.iterdir()) == []


def test_a_redis_key_named_like_a_chunk_is_copied_and_its_copy_not_deleted(
        tmp_path: Path, redis_server: Any) -> None:
    """``sync --delete redis://h/p/ out/`` with ``p/m`` (an object) and ``SET p/m:1``
    beside it: ``p/m:1`` was taken for a chunk of ``p/m``, not copied, and its copy at
    the destination deleted as extraneous."""
    src = _prefix()
    with ts_open(redis_server.url(f"{src}/m"), "wb") as w:
        w.write(b"object")
    with redis_server.client() as c:
        c.set(f"{src}/m:1", b"a key of its own")
    out = tmp_path / "out"
    out.mkdir()
    (out / "m:1").write_bytes(b"a key of its own")
    r = subprocess.run([sys.executable, "-m", "tensorstream", "sync", "--delete",
                        redis_server.url(f"{src}/"), f"{out}/"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "delete" not in r.stdout
    assert (out / "m:1").read_bytes() == b"a key of its own"
    assert (out / "m").read_bytes() == b"object"


@pytest.mark.parametrize("end", [" ", "\t", "  "])
def test_an_s3_key_ending_in_whitespace_can_be_named(
        tmp_path: Path, moto_s3: Any, end: str) -> None:
    """``cat 's3://b/p/k '``, ``cp``, ``rm``: refused as "starts or ends with whitespace"
    with advice for local files, while S3 decodes no ``%20``: such a key, which ``cp -r``
    lists and copies, could not be named at all (aws s3 cp takes it)."""
    src = _prefix()
    moto_s3.put(S3_BUCKET, f"{src}/k{end}", b"spaced")
    moto_s3.put(S3_BUCKET, f"{src}/k", b"plain")  # the neighbour, never taken instead
    uri = f"s3://{S3_BUCKET}/{src}/k{end}"
    with ts_open(uri, **moto_s3.options()) as f:
        assert f.read() == b"spaced"
    r = copy(uri, str(tmp_path / "got"), **moto_s3.options())
    assert r.ok, r.errors
    assert (tmp_path / "got").read_bytes() == b"spaced"


def test_a_key_named_like_a_chunk_is_refused_into_redis_by_name(
        moto_s3: Any, redis_server: Any) -> None:
    """S3 -> Redis of ``m`` and ``m:0123456789abcdef:0``: the second was written, then
    left out of every listing as a stale chunk of ``m`` (so S3 -> Redis -> S3 lost it
    without a word). It is refused by name; ``m`` and ``m:1`` are copied."""
    src, dst = _prefix(), _prefix()
    chunky = "m:0123456789abcdef:0"
    for name in ("m", "m:1", chunky):
        moto_s3.put(S3_BUCKET, f"{src}/{name}", name.encode())
    r = copy(f"s3://{S3_BUCKET}/{src}/", redis_server.url(f"{dst}/"), recursive=True,
             **moto_s3.options())
    assert not r.ok and len(r.errors) == 1 and chunky in r.errors[0], r.errors
    assert "named like a chunk" in r.errors[0]
    with redis_server.client() as c:
        assert not c.exists(f"{dst}/{chunky}")
    for name in ("m", "m:1"):
        with ts_open(redis_server.url(f"{dst}/{name}")) as f:
            assert f.read() == name.encode()
    with pytest.raises(errors.InvalidURIError, match="named like a chunk"):
        ts_open(redis_server.url(f"{dst}/x:{'ab' * 8}:7"), "wb")


def test_a_key_whose_path_is_longer_than_path_max_is_not_copied_again(
        redis_server: Any, tmp_path: Path) -> None:
    """A Redis key 25 segments of 200 bytes deep (each a name a directory takes, the
    whole past PATH_MAX, 4096 bytes): the copy reaches it a directory at a time, but
    sync looked at its copy by its whole path (``File name too long``), took it for
    missing and copied it again on every run. Its neighbour at the top is skipped."""
    prefix = _prefix()
    deep = "/".join(["d" * 200] * 25) + "/f.bin"
    redis_server.put(f"{prefix}/{deep}", b"deep")
    redis_server.put(f"{prefix}/top.bin", b"top")
    dst = tmp_path / "dst"
    for status in ("copied", "skipped"):
        r = copy(redis_server.url(prefix + "/"), str(dst), recursive=True,
                 skip_unchanged=True)
        assert r.ok, r.errors
        assert sorted((o.dst.rsplit("/", 1)[-1], o.status) for o in r.outcomes) == [
            ("f.bin", status), ("top.bin", status)]
