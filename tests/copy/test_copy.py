"""The copy engine: byte-exact across backends, recursive trees, safety, verification.

Backends are parametrized through fixtures (``src_backend`` / ``dst_backend``,
``SOURCES`` / ``DESTINATIONS``), each a store of tests/stores.py. ``mem`` is a small real
provider registered through the public ``tensorstream.register`` API: it
exercises the sequential-writer path and can list hostile keys that no local
tree can produce. Memory is in test_copy_buffers.py, refusals and errors in
test_copy_errors.py.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from memory_provider import MemProvider
from stores import Store, make_store, mem_store
from tensorstream.copy.engine import copy, copy_tree

SOURCES = ["local", "http", "mem", "s3", "redis"]
DESTINATIONS = ["local", "mem", "s3", "redis"]
LISTABLE = {"local", "mem", "s3", "redis"}


@pytest.fixture(params=SOURCES)
def src_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, request, tmp_path / "src")


@pytest.fixture(params=DESTINATIONS)
def dst_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, request, tmp_path / "dst")


def payload(n: int) -> bytes:
    return os.urandom(n)


@pytest.mark.parametrize("size", [0, 1, 300_000, 3 * (1 << 20) + 7])
def test_matrix_byte_exact(src_backend: Store, dst_backend: Store, size: int) -> None:
    data = payload(size)
    src_backend.put("dir/model.bin", data)
    result = copy(src_backend.uri("dir/model.bin"), dst_backend.uri("out/model.bin"),
                  part_size=256 << 10, concurrency=4,
                  **{**src_backend.options, **dst_backend.options})
    assert result.ok, result.errors
    # A Redis string names no version: read in more than one request, it cannot be
    # known to be one version (test_a_source_that_names_no_version_is_never_reported_verified).
    one_version = src_backend.name != "redis" or size <= 1 << 20
    assert result.files == 1 and result.bytes == size and result.verified is one_version
    assert dst_backend.get("out/model.bin") == data


def test_recursive_tree_layout_like_aws(src_backend: Store, dst_backend: Store) -> None:
    if src_backend.name not in LISTABLE:
        pytest.skip(f"{src_backend.name} cannot list")
    tree = {"a.bin": payload(1000), "sub/b.bin": payload(70_000), "sub/deep/c.bin": b""}
    for k, v in tree.items():
        src_backend.put(f"model/{k}", v)
    src_backend.put("model-evil/x.bin", b"must not be copied")  # sibling prefix
    result = copy_tree(src_backend.uri("model"), dst_backend.uri("copy/"), part_size=16 << 10,
                       **{**src_backend.options, **dst_backend.options})
    assert result.ok, result.errors
    assert result.files == 3
    for k, v in tree.items():
        assert dst_backend.get(f"copy/{k}") == v
    with pytest.raises((KeyError, FileNotFoundError)):
        dst_backend.get("copy/x.bin")


def test_several_sources_into_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"A" * 10)
    b.write_bytes(b"B" * 20)
    result = copy([str(a), str(b)], str(tmp_path / "out"))
    assert result.ok and result.files == 2
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"A" * 10
    assert (tmp_path / "out" / "b.bin").read_bytes() == b"B" * 20


def test_traversal_keys_never_escape(tmp_path: Path) -> None:
    mem = mem_store()
    hostile = ["../x", "a/../../x", "..", "/abs", "a//b", "../dst-evil/pwn"]
    for k in hostile:
        mem.put(f"data/{k}", b"evil")
    mem.put("data/ok.bin", b"fine")
    dst = tmp_path / "dst"
    result = copy_tree(mem.uri("data/"), str(dst))
    assert not result.ok
    assert len(result.errors) == len(hostile)
    assert all("refused" in e for e in result.errors)
    assert result.files == 1 and (dst / "ok.bin").read_bytes() == b"fine"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written == ["dst", "dst/ok.bin"]


def test_file_and_directory_keys_and_markers_are_deterministic(tmp_path: Path) -> None:
    mem = mem_store()
    for k in ["a", "a/b", "dir/", "dir/c", "full/"]:
        # an empty marker is skipped; one holding bytes is an error naming it
        mem.put(f"p/{k}", b"" if k == "dir/" else k.encode())
    outcomes = []
    for i in range(2):
        dst = tmp_path / f"d{i}"
        r = copy_tree(mem.uri("p/"), str(dst))
        files = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
        outcomes.append((files, r.errors, len(r.skipped)))
    assert outcomes[0] == outcomes[1]
    files, errors, skipped = outcomes[0]
    assert files == ["a/b", "dir/c"]
    assert len(errors) == 2 and "'a'" in errors[0] and skipped == 1
    assert "p/full/: skipped: a directory marker holding 5 bytes" in errors[1]


def test_symlink_in_destination_not_followed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.bin").write_bytes(b"data")
    dst, outside = tmp_path / "dst", tmp_path / "outside"
    dst.mkdir()
    outside.mkdir()
    (dst / "sub").symlink_to(outside)
    result = copy_tree(str(src), str(dst))
    assert not result.ok and "symlink" in result.errors[0]
    assert list(outside.iterdir()) == []


def test_verification_failure_removes_destination() -> None:
    src, dst = mem_store(), mem_store()
    src.put("m.bin", payload(100_000))
    MemProvider.corrupt_writes = True
    try:
        result = copy(src.uri("m.bin"), dst.uri("m.bin"), part_size=32 << 10)
    finally:
        MemProvider.corrupt_writes = False
    assert not result.ok and "verification failed" in result.errors[0]
    with pytest.raises(KeyError):
        dst.get("m.bin")


def test_a_listing_that_broke_off_is_an_error_not_the_whole_source(tmp_path: Path) -> None:
    """"Not found" after the first entries of a listing (a 404 for a later page) is no
    empty prefix: the entries so far were copied as if they were all of SRC, ok."""
    src = mem_store()
    for key in ("p/a", "p/b", "p/c"):
        src.put(key, key.encode())
    MemProvider.list_fails_after = 2
    try:
        result = copy_tree(src.uri("p/"), str(tmp_path / "out"))
    finally:
        MemProvider.list_fails_after = None
    assert not result.ok and "answered 404" in result.errors[0], result.errors


def test_a_destination_that_fails_verification_and_cannot_be_removed_is_reported() -> None:
    """A copy read back wrong whose destination then cannot be deleted must not
    say it was removed: the bad object is still there, and the report says so."""
    src, dst = mem_store(), mem_store()
    src.put("m.bin", payload(100_000))
    MemProvider.corrupt_writes = MemProvider.refuse_deletes = True
    try:
        result = copy(src.uri("m.bin"), dst.uri("m.bin"), part_size=32 << 10)
    finally:
        MemProvider.corrupt_writes = MemProvider.refuse_deletes = False
    assert not result.ok and "verification failed" in result.errors[0]
    assert "could not be removed" in result.errors[0], result.errors
    assert "it was removed" not in result.errors[0]
    assert result.outcomes[0].published  # left behind, and said so
    assert dst.get("m.bin") != payload(100_000)


def test_no_verify_skips_check() -> None:
    src, dst = mem_store(), mem_store()
    src.put("m.bin", payload(1000))
    result = copy(src.uri("m.bin"), dst.uri("m.bin"), verify=False)
    assert result.ok and not result.verified


def test_source_changed_mid_copy_fails_cleanly(tmp_path: Path, http_server: Any,
                                               http_reset: None) -> None:
    data = payload(2 << 20)
    http_server.put("chg/m.bin", data)
    http_server.faults.replace_after_requests = 2
    dst = tmp_path / "m.bin"
    result = copy(http_server.url("chg/m.bin"), str(dst), part_size=128 << 10, concurrency=2,
                  retries=1)
    assert not result.ok
    assert not dst.exists() and list(tmp_path.iterdir()) == []


def test_a_source_that_names_no_version_is_never_reported_verified(
        tmp_path: Path, http_server: Any, http_reset: None, redis_server: Any) -> None:
    """A server sending neither ETag nor Last-Modified, its object replaced by as many bytes
    mid-copy: the file mixed both versions and was reported copied and verified (the size,
    all there was to compare, had not changed). Nothing can see such a change, so the copy
    is not reported verified, with a note saying why; one request is one version."""
    data = payload(2 << 20)
    http_server.put("nover/m.bin", data)
    http_server.faults.key = "nover/m.bin"
    http_server.faults.no_etag = http_server.faults.no_last_modified = True
    http_server.faults.replace_after_requests = 2
    result = copy(http_server.url("nover/m.bin"), str(tmp_path / "m.bin"),
                  part_size=256 << 10, concurrency=1)
    assert result.files == 1 and not result.verified
    assert any("names no version" in note for note in result.notes), result.notes
    http_server.put("nover/m.bin", data)  # one part, one GET: one version
    result = copy(http_server.url("nover/m.bin"), str(tmp_path / "one.bin"))
    assert result.verified and not result.notes, result.notes
    # A Redis string (no version at all) read in several GETRANGEs; one of 1 MiB is one read.
    key = f"nover-{secrets.token_hex(4)}"
    redis_server.put(key, data)
    redis_server.put(key + "-small", data[: 1 << 20])
    for name, verified in ((key, False), (key + "-small", True)):
        result = copy(redis_server.url(name), str(tmp_path / name), part_size=256 << 10)
        assert result.ok and result.verified is verified, result.notes
        assert (tmp_path / name).read_bytes() == data[: len((tmp_path / name).read_bytes())]


def test_traversal_keys_from_s3_listing(tmp_path: Path, moto_s3: Any) -> None:
    from fixtures_s3 import S3_BUCKET

    prefix = f"trav-{secrets.token_hex(4)}"
    for k in ["../x", "a/../../x", "a//b", "ok.bin"]:
        moto_s3.put(S3_BUCKET, f"{prefix}/{k}", b"data")
    moto_s3.put(S3_BUCKET, f"{prefix}-evil/y", b"sibling")
    dst = tmp_path / "dst"
    result = copy_tree(f"s3://{S3_BUCKET}/{prefix}", str(dst), **moto_s3.options())
    assert result.files == 1 and len(result.errors) == 3
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "dst", "dst/ok.bin"]
