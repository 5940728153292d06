"""What the copy engine refuses, and errors that say what to do: a failed upload leaves
nothing, a directory is not copied into itself, a file or directory in the way, a local name
that is not UTF-8 for S3, a bare bucket, a device or FIFO at the destination, a prefix without
``-r``, counts and sizes that are not whole numbers, a missing local source, an HTTP URL with
``-r``."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from tensorstream.copy.engine import copy, copy_tree


def test_failed_upload_leaves_no_object_and_no_multipart(http_server: Any, http_reset: None,
                                                         moto_s3: Any) -> None:
    from fixtures_s3 import S3_BUCKET

    data = os.urandom(12 << 20)
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
