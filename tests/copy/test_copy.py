"""The copy engine: byte-exact across backends, recursive trees, safety, verification.

Backends are parametrized through fixtures (``src_backend`` / ``dst_backend``);
S3 and Redis join the matrix by adding their fixture names to ``SOURCES`` /
``DESTINATIONS`` once their session servers exist. ``mem`` is a small real
provider registered through the public ``tensorstream.register`` API: it
exercises the sequential-writer path and can list hostile keys that no local
tree can produce.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from memory_provider import MemProvider
from tensorstream.copy.engine import copy, copy_tree

tensorstream.register("memtest", MemProvider, replace=True)


@dataclasses.dataclass
class Backend:
    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


def _local(tmp_path: Path, sub: str) -> Backend:
    root = tmp_path / sub
    root.mkdir(exist_ok=True)

    def put(key: str, data: bytes) -> None:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)

    return Backend("local", lambda k: str(root / k), put, lambda k: (root / k).read_bytes())


def _mem() -> Backend:
    bucket = "b" + secrets.token_hex(4)

    def put(key: str, data: bytes) -> None:
        MemProvider.store[f"{bucket}/{key}"] = data

    def get(key: str) -> bytes:
        return MemProvider.store[f"{bucket}/{key}"]

    return Backend("mem", lambda k: f"memtest://{bucket}/{k}", put, get)


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path, sub: str) -> Backend:
    if name == "local":
        return _local(tmp_path, sub)
    if name == "mem":
        return _mem()
    if name == "http":
        server = request.getfixturevalue("http_server")
        request.getfixturevalue("http_reset")
        prefix = secrets.token_hex(4)
        return Backend("http", lambda k: server.url(f"{prefix}/{k}"),
                       lambda k, d: server.put(f"{prefix}/{k}", d),
                       lambda k: server.get(f"{prefix}/{k}"), dict(server.options))
    if name == "s3":
        from fixtures_s3 import S3_BUCKET

        s3 = request.getfixturevalue("moto_s3")
        prefix = f"cp-{secrets.token_hex(4)}"
        def s3get(k: str) -> bytes:
            if not s3.exists(S3_BUCKET, f"{prefix}/{k}"):
                raise FileNotFoundError(k)
            return s3.get(S3_BUCKET, f"{prefix}/{k}")

        return Backend("s3", lambda k: f"s3://{S3_BUCKET}/{prefix}/{k}",
                       lambda k, d: s3.put(S3_BUCKET, f"{prefix}/{k}", d), s3get, s3.options())
    if name == "redis":
        srv = request.getfixturevalue("redis_server")
        prefix = f"cp-{secrets.token_hex(4)}"

        def rget(k: str) -> bytes:
            with tensorstream.open(srv.url(f"{prefix}/{k}")) as f:
                return f.read()

        return Backend("redis", lambda k: srv.url(f"{prefix}/{k}"),
                       lambda k, d: srv.put(f"{prefix}/{k}", d), rget)
    raise AssertionError(name)


SOURCES = ["local", "http", "mem", "s3", "redis"]
DESTINATIONS = ["local", "mem", "s3", "redis"]
LISTABLE = {"local", "mem", "s3", "redis"}


@pytest.fixture(params=SOURCES)
def src_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path, "src")


@pytest.fixture(params=DESTINATIONS)
def dst_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path, "dst")


def payload(n: int) -> bytes:
    return os.urandom(n)


@pytest.mark.parametrize("size", [0, 1, 300_000, 3 * (1 << 20) + 7])
def test_matrix_byte_exact(src_backend: Backend, dst_backend: Backend, size: int) -> None:
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


def test_recursive_tree_layout_like_aws(src_backend: Backend, dst_backend: Backend) -> None:
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
    mem = _mem()
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
    mem = _mem()
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
    src, dst = _mem(), _mem()
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
    src = _mem()
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
    src, dst = _mem(), _mem()
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
    src, dst = _mem(), _mem()
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


def test_memory_bounded_by_parts_in_flight(tmp_path: Path) -> None:
    import tracemalloc

    from tensorstream.copy.receive import CHUNK

    src = tmp_path / "big.bin"
    src.write_bytes(payload(16 << 20))
    tracemalloc.start()
    try:
        result = copy(str(src), str(tmp_path / "out.bin"), part_size=64 << 10, concurrency=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok and result.verified
    # 16 MiB copied with 3 parts in flight, each through one chunk buffer (taken
    # from a free list, whichever of the data plane's threads runs the part):
    # far below the object size, whatever ran in this process before.
    assert peak < 3 * CHUNK + (1 << 20), peak


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_chunk_buffers_are_private_anonymous_maps(tmp_path: Path) -> None:
    import ctypes
    import mmap

    from tensorstream.copy import receive

    src = tmp_path / "src.bin"
    src.write_bytes(payload(3 << 20))
    result = copy(str(src), str(tmp_path / "out.bin"), part_size=1 << 20, concurrency=3)
    assert result.ok and result.verified
    # A buffer the copy used (back on the free list) or a new one: either way a
    # private map (a shared anonymous one is shmem, dearer to fault in per page).
    buf = receive._take_chunk()
    try:
        holder = ctypes.c_char.from_buffer(buf)
        addr = ctypes.addressof(holder)
        del holder
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= addr < hi:
                    assert perms.endswith("p"), line
                    assert "/dev/zero" not in line, line
                    break
            else:
                pytest.fail("chunk buffer not found in /proc/self/maps")
        assert addr % mmap.PAGESIZE == 0
    finally:
        receive._give_back(buf)


def test_failed_upload_leaves_no_object_and_no_multipart(http_server: Any, http_reset: None,
                                                         moto_s3: Any) -> None:
    from fixtures_s3 import S3_BUCKET

    data = payload(12 << 20)
    http_server.put("chg/up.bin", data)
    # Source replaced mid-copy: after the first of three parts (S3 parts are at
    # least 5 MiB), so parts already uploaded must go with the upload.
    http_server.faults.replace_after_requests = 1
    prefix = f"fail-{secrets.token_hex(4)}"
    result = copy(http_server.url("chg/up.bin"), f"s3://{S3_BUCKET}/{prefix}/up.bin",
                  part_size=5 << 20, concurrency=1, retries=1, **moto_s3.options())
    assert not result.ok
    assert not moto_s3.exists(S3_BUCKET, f"{prefix}/up.bin")
    assert moto_s3.open_multipart_uploads(S3_BUCKET, prefix) == []


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


def test_a_directory_is_not_copied_into_itself(tmp_path: Path) -> None:
    """``cp -r src src/sub/copy``: each run copied the last run's copies a level deeper
    (a sync run every hour doubles the tree); refused, as cp refuses it, symlinks resolved."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a")
    (src / "sub" / "b.bin").write_bytes(b"b")
    (tmp_path / "link").symlink_to(src)
    for source, dest in [(src, src / "sub" / "copy"), (tmp_path / "link", src / "c2"),
                         (src, tmp_path / "link" / "c3")]:
        result = copy_tree(str(source), str(dest))
        assert not result.ok and len(result.errors) == 1
        assert "cannot copy a directory into itself" in result.errors[0]
    assert sorted(str(p.relative_to(src)) for p in src.rglob("*")) == ["a.bin", "sub",
                                                                        "sub/b.bin"]
    result = copy_tree(str(src / "sub"), str(src))  # a directory into its parent is fine
    assert result.ok and (src / "b.bin").read_bytes() == b"b"
    result = copy_tree(str(src), str(tmp_path / "src-copy"))  # a sibling sharing the prefix
    assert result.ok and (tmp_path / "src-copy" / "a.bin").read_bytes() == b"a"


def test_a_file_or_directory_in_the_way_is_named(tmp_path: Path) -> None:
    """A file where the destination directory must be said 'File exists: DIR' once per
    object; a directory where a file goes was found at the rename, after the transfer, as
    'Is a directory: .NAME.tensorstream-<hex>.tmp -> NAME'. Both name what is in the way."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    (tmp_path / "file").write_bytes(b"in the way")
    result = copy_tree(str(src), str(tmp_path / "file"))
    assert not result.ok
    assert f"the destination directory {tmp_path / 'file'} cannot be made: a file is in its " \
           "way" in result.errors[0]
    assert (tmp_path / "file").read_bytes() == b"in the way"
    (tmp_path / "dst" / "a.bin").mkdir(parents=True)
    result = copy_tree(str(src), str(tmp_path / "dst"))
    assert not result.ok and result.bytes == 0
    assert f"{tmp_path / 'dst' / 'a.bin'} is a directory; a file cannot take its place" \
           in result.errors[0]
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["a.bin"]


def test_a_local_name_that_is_not_utf8_is_refused_for_s3_and_the_rest_copied(
        tmp_path: Path, moto_s3: Any) -> None:
    """A file name that is not UTF-8 cannot be an S3 key. One that sorted first failed the
    whole copy with a bare UnicodeEncodeError (nothing copied, the name unsaid): the bucket's
    check lists under the first target before the uploads refuse such keys one by one."""
    from fixtures_s3 import S3_BUCKET

    prefix = f"utf8-{secrets.token_hex(4)}"
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.bin").write_bytes(b"fine")
    bad = os.path.join(os.fsencode(src), b"bad\xffname")
    with open(bad, "wb") as f:
        f.write(b"latin-1 name")
    result = copy_tree(str(src), f"s3://{S3_BUCKET}/{prefix}/", **moto_s3.options())
    assert result.files == 1 and len(result.errors) == 1, result.errors
    assert "bad\\udcffname" in repr(result.errors[0]) and "S3 keys are UTF-8" in result.errors[0]
    assert moto_s3.get(S3_BUCKET, f"{prefix}/ok.bin") == b"fine"
    result = copy(str(src / "ok.bin"), f"s3://{S3_BUCKET}/{prefix}/x" + os.fsdecode(b"\xff"),
                  **moto_s3.options())
    assert result.files == 0 and "S3 keys are UTF-8" in result.errors[0]


def test_a_bare_bucket_source_gets_an_error_that_says_what_to_do(tmp_path: Path,
                                                                 moto_s3: Any) -> None:
    """``cp s3://bucket DST``, ``cp -r`` of an empty or missing bucket: each said only
    ``S3 paths are bucket/key, got 'bucket'`` (the fallback stat of a bare bucket)."""
    from fixtures_s3 import S3_BUCKET

    empty = f"empty-{secrets.token_hex(4)}"
    moto_s3.create_bucket(empty)
    try:
        result = copy_tree(f"s3://{empty}", str(tmp_path / "a"), **moto_s3.options())
        assert result.errors == [f"s3://{empty}: nothing to copy at s3://{empty} (the bucket "
                                 "is empty)"]
    finally:
        moto_s3.client.delete_bucket(Bucket=empty)
    missing = f"missing-{secrets.token_hex(4)}"
    result = copy_tree(f"s3://{missing}", str(tmp_path / "b"), **moto_s3.options())
    assert len(result.errors) == 1 and f"no such bucket '{missing}'" in result.errors[0]
    result = copy(f"s3://{S3_BUCKET}", str(tmp_path / "c") + "/", **moto_s3.options())
    assert result.errors == [f"s3://{S3_BUCKET}: s3://{S3_BUCKET} is a bucket, not an object; "
                             "add -r (--recursive) to copy the objects in it"]
    assert not any("bucket/key" in e for e in result.errors)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


def test_a_device_or_fifo_at_the_destination_is_never_replaced(tmp_path: Path) -> None:
    """The temp file's rename replaced whatever node had the destination's name: ``cp x
    /dev/null`` as root left /dev/null a regular file, a FIFO a reader waited on vanished."""
    import stat

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"a")
    (tmp_path / "src" / "b.bin").write_bytes(b"b")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "null").symlink_to("/dev/null")
    for target in ("fifo", "null"):
        result = copy(str(tmp_path / "src" / "a.bin"), str(tmp_path / target))
        assert result.files == 0 and len(result.errors) == 1
        assert "never replaces" in result.errors[0] and "cp SRC - >" in result.errors[0]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert os.readlink(tmp_path / "null") == "/dev/null"
    (tmp_path / "dst").mkdir()
    os.mkfifo(tmp_path / "dst" / "a.bin")
    result = copy_tree(str(tmp_path / "src"), str(tmp_path / "dst"))
    assert result.files == 1 and len(result.errors) == 1 and "a FIFO" in result.errors[0]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "dst" / "a.bin").st_mode)
    assert (tmp_path / "dst" / "b.bin").read_bytes() == b"b"


def test_a_prefix_with_a_folder_marker_without_recursive_says_to_add_r(tmp_path: Path,
                                                                       moto_s3: Any) -> None:
    """``cp s3://b/dir/ out/`` copied the S3 console's empty ``dir/`` marker as an empty file
    ``out/dir`` and exited 0; without the marker the same command said to add -r."""
    from fixtures_s3 import S3_BUCKET

    prefix = f"mark-{secrets.token_hex(4)}"
    moto_s3.put(S3_BUCKET, f"{prefix}/dir/", b"")
    moto_s3.put(S3_BUCKET, f"{prefix}/dir/x.bin", b"x")
    moto_s3.put(S3_BUCKET, f"{prefix}/nomark/y.bin", b"y")
    for name in ("dir", "nomark"):
        src = f"s3://{S3_BUCKET}/{prefix}/{name}/"
        result = copy(src, str(tmp_path / "out") + "/", **moto_s3.options())
        assert result.files == 0 and result.errors == [
            f"{src}: {src} is a prefix, not an object; add -r (--recursive) to copy the "
            "objects under it"]
    assert not (tmp_path / "out").exists()
    result = copy_tree(f"s3://{S3_BUCKET}/{prefix}/dir/", str(tmp_path / "r"),
                       **moto_s3.options())
    assert result.ok and (tmp_path / "r" / "x.bin").read_bytes() == b"x"


@pytest.mark.parametrize("bad", [{"part_size": 1.5}, {"part_size": float("nan")},
                                 {"part_size": "8M"}, {"jobs": 1.5}, {"concurrency": True}])
def test_a_count_or_size_that_is_not_a_whole_number_is_refused_by_name(
        tmp_path: Path, bad: dict[str, Any]) -> None:
    """``part_size=1.5`` failed each object with "'float' object cannot be interpreted as
    an integer" (``result.ok`` False, no exception); ``jobs=1.5`` was taken as it came."""
    (tmp_path / "a.bin").write_bytes(b"a" * 100)
    name, = bad
    with pytest.raises(ValueError, match=f"{name} must be a whole number"):
        copy(str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), **bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]
    import numpy as np

    result = copy(str(tmp_path / "a.bin"), str(tmp_path / "c.bin"), part_size=np.int64(64),
                  jobs=np.int32(2))
    assert result.ok and (tmp_path / "c.bin").read_bytes() == b"a" * 100


def test_a_missing_local_source_with_recursive_says_it_is_not_there(tmp_path: Path) -> None:
    """``cp -r /typo dst`` said ``nothing to copy at /typo``, as for an empty prefix."""
    for source in (tmp_path / "missing", f"{tmp_path / 'missing'}/"):
        result = copy_tree(str(source), str(tmp_path / "dst"))
        assert len(result.errors) == 1
        assert f"no such file or directory: {tmp_path / 'missing'}" in result.errors[0]
    assert not (tmp_path / "dst").exists()


def test_recursive_copy_of_an_http_url_copies_the_object_it_names(
        tmp_path: Path, http_server: Any, http_reset: None) -> None:
    """``cp -r URL`` failed with "http does not support list", where ``cp -r`` of one S3
    object copies it; a URL ending in '/' names no object: said, not an index page saved."""
    key = f"{secrets.token_hex(4)}/m.bin"
    http_server.put(key, b"m" * 100)
    result = copy_tree(http_server.url(key), str(tmp_path / "out"), **http_server.options)
    assert result.ok, result.errors
    assert (tmp_path / "out" / "m.bin").read_bytes() == b"m" * 100
    result = copy_tree(http_server.url(key.split("/")[0] + "/"), str(tmp_path / "o2"),
                       **http_server.options)
    assert len(result.errors) == 1 and "http has no listing" in result.errors[0]
    assert "does not support list" not in result.errors[0]
    assert not (tmp_path / "o2").exists()
