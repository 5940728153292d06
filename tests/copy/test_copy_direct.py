"""Durable local copies written with ``O_DIRECT`` (``tensorstream.copy.direct``).

Whether a copy went to the disk directly is read from the page cache: a
buffered write leaves every page of the file resident, a direct one none
(but the page of an unaligned tail, written through the page cache). The
check runs before anything reads the file (a read would bring it in).
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from page_cache import direct_io_at, resident_pages
from tensorstream.copy.direct import ALIGN, PositionalWrites, open_direct
from tensorstream.copy.engine import copy

MiB = 1 << 20


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """A directory on a filesystem that takes ``O_DIRECT`` (tmp_path's, if it does)."""
    if not direct_io_at(tmp_path):
        pytest.skip("the temp directory's filesystem has no O_DIRECT")
    return tmp_path


SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, MiB - 1, MiB + 1, 3 * MiB + 4097]


@pytest.mark.parametrize("size", SIZES)
def test_durable_copy_goes_to_the_disk_directly(disk: Path, http_server: Any, http_reset: None,
                                                 size: int) -> None:
    data = os.urandom(size)
    key = f"direct/{secrets.token_hex(4)}.bin"
    http_server.put(key, data)
    dst = disk / "out.bin"
    # 1 MiB parts: three whole parts and a ragged last one for the largest size.
    result = copy(http_server.url(key), str(dst), part_size=MiB)
    assert result.ok and result.verified, result.errors
    assert resident_pages(dst) <= (1 if size % ALIGN else 0)
    assert dst.read_bytes() == data
    assert sorted(p.name for p in disk.iterdir()) == ["out.bin"]


def test_without_direct_or_fsync_the_copy_is_in_the_page_cache(disk: Path, http_server: Any,
                                                               http_reset: None) -> None:
    data = os.urandom(2 * MiB)
    key = f"direct/{secrets.token_hex(4)}.bin"
    http_server.put(key, data)
    for name, opts in [("nodirect.bin", {"direct": False}), ("nofsync.bin", {"durable": False})]:
        dst = disk / name
        result = copy(http_server.url(key), str(dst), part_size=MiB, **opts)
        assert result.ok, result.errors
        assert resident_pages(dst) == 2 * MiB // mmap.PAGESIZE, name
        assert dst.read_bytes() == data


def test_no_fsync_goes_direct_when_asked(disk: Path, http_server: Any,
                                         http_reset: None) -> None:
    data = os.urandom(2 * MiB + 1)
    key = f"direct/{secrets.token_hex(4)}.bin"
    http_server.put(key, data)
    dst = disk / "nofsync-direct.bin"
    result = copy(http_server.url(key), str(dst), part_size=MiB, durable=False, direct=True)
    assert result.ok, result.errors
    assert resident_pages(dst) <= 1
    assert dst.read_bytes() == data


@pytest.mark.parametrize("source", ["s3", "redis", "local"])
def test_every_source_kind_writes_directly(disk: Path, source: str,
                                           request: pytest.FixtureRequest) -> None:
    data = os.urandom(2 * MiB + 4097)
    name = f"d-{secrets.token_hex(4)}.bin"
    options: dict[str, Any] = {}
    if source == "s3":
        from fixtures_s3 import S3_BUCKET

        s3 = request.getfixturevalue("moto_s3")
        s3.put(S3_BUCKET, name, data)
        uri, options = f"s3://{S3_BUCKET}/{name}", s3.options()
    elif source == "redis":
        srv = request.getfixturevalue("redis_server")
        srv.put(name, data)
        uri = srv.url(name)
    else:
        src = disk / "src" / name
        src.parent.mkdir()
        src.write_bytes(data)
        uri = str(src)
    dst = disk / "dst" / name
    result = copy(uri, str(dst), part_size=MiB, **options)
    assert result.ok, result.errors
    assert resident_pages(dst) <= 1
    assert dst.read_bytes() == data


def test_a_copy_into_tmpfs_is_exact(http_server: Any, http_reset: None) -> None:
    # tmpfs refuses O_DIRECT at open before Linux 6.6 and takes it since.
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no tmpfs at /dev/shm")
    data = os.urandom(MiB + 4097)
    key = f"direct/{secrets.token_hex(4)}.bin"
    http_server.put(key, data)
    dst = shm / f"tensorstream-test-{secrets.token_hex(4)}" / "out.bin"
    try:
        result = copy(http_server.url(key), str(dst), part_size=MiB)
        assert result.ok and result.verified, result.errors
        assert dst.read_bytes() == data
        assert sorted(p.name for p in dst.parent.iterdir()) == ["out.bin"]
    finally:
        dst.unlink(missing_ok=True)
        dst.parent.rmdir()


def test_a_filesystem_refusing_direct_io_at_open_gets_buffered_writes(
        disk: Path, http_server: Any, http_reset: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel's answer on such a filesystem (tmpfs before 6.6): EINVAL at open.
    real_open = os.open
    refused: list[str] = []

    def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT:
            refused.append(str(path))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    data = os.urandom(2 * MiB + 4097)
    key = f"direct/{secrets.token_hex(4)}.bin"
    http_server.put(key, data)
    dst = disk / "buffered.bin"
    result = copy(http_server.url(key), str(dst), part_size=MiB)
    assert result.ok and result.verified, result.errors
    assert len(refused) == 1
    assert resident_pages(dst) == -(-len(data) // mmap.PAGESIZE)
    assert dst.read_bytes() == data


def test_a_name_that_no_longer_leads_to_the_file_is_not_written_through(disk: Path) -> None:
    fd = os.open(disk / "a.bin", os.O_RDWR | os.O_CREAT, 0o600)
    (disk / "b.bin").write_bytes(b"")
    dir_fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert open_direct(dir_fd, "b.bin", fd) is None
    finally:
        os.close(dir_fd)
        os.close(fd)


def _writes(disk: Path) -> tuple[PositionalWrites, int, Path]:
    path = disk / "w.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    dir_fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dfd = open_direct(dir_fd, "w.bin", fd)
    finally:
        os.close(dir_fd)
    assert dfd is not None
    return PositionalWrites(fd, dfd), fd, path


def test_unaligned_buffers_and_offsets_are_written_exactly(disk: Path) -> None:
    w, fd, path = _writes(disk)
    data = os.urandom(3 * ALIGN + 100)
    page = memoryview(mmap.mmap(-1, 4 * ALIGN))
    page[: len(data)] = data
    try:
        w.write(0, page[: 2 * ALIGN])                 # aligned: direct
        w.write(2 * ALIGN, page[2 * ALIGN + 0: len(data)])  # aligned offset, ragged tail
        w.write(len(data), memoryview(b"xyz"))          # read-only and unaligned: buffered
        w.write(len(data) + 3, page[1: ALIGN + 1])      # unaligned address: buffered
    finally:
        w.close()
        os.close(fd)
    assert w.direct_bytes == 3 * ALIGN
    assert path.read_bytes() == data + b"xyz" + data[1: ALIGN + 1]


def test_a_write_refused_by_the_filesystem_falls_back_to_buffered(
        disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Some filesystems open with O_DIRECT and refuse the first write (EINVAL).
    w, fd, path = _writes(disk)
    refused: list[int] = []
    real_pwrite = os.pwrite

    def pwrite(f: int, buf: Any, offset: int) -> int:
        if f != fd:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(f, buf, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    chunk = memoryview(mmap.mmap(-1, 2 * ALIGN))
    chunk[:] = os.urandom(2 * ALIGN)
    try:
        w.write(0, chunk[:ALIGN])
        w.write(ALIGN, chunk[ALIGN:])
    finally:
        w.close()
        os.close(fd)
    assert refused == [0] and not w.direct and w.direct_bytes == 0
    assert path.read_bytes() == bytes(chunk)


def test_a_part_size_off_the_alignment_is_copied_exactly(disk: Path, http_server: Any,
                                                          http_reset: None) -> None:
    data = os.urandom(5 * 6000 + 17)
    key = f"direct/{secrets.token_hex(4)}.bin"
    http_server.put(key, data)
    dst = disk / "odd.bin"
    result = copy(http_server.url(key), str(dst), part_size=6000, concurrency=3)
    assert result.ok and result.verified, result.errors
    assert dst.read_bytes() == data
