"""PinnedFile: one version of a local file, read with gathered positional reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorstream import errors
from tensorstream.providers.local import provider
from tensorstream.providers.local.provider import PinnedFile

DATA = bytes(range(256)) * 40  # 10240 bytes


def _etag(path: Path) -> str:
    return provider._etag(os.stat(path))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "f.bin"
    p.write_bytes(DATA)
    return p


def test_gathered_reads_fill_every_buffer_in_order(path: Path) -> None:
    with PinnedFile(str(path), _etag(path)) as f:
        bufs = [memoryview(bytearray(n)) for n in (3, 0, 500, 17)]
        f.read_at(100, bufs)
        assert b"".join(bytes(b) for b in bufs) == DATA[100:620]


def test_a_file_replaced_by_rename_keeps_being_read_from_its_version(path: Path,
                                                                     tmp_path: Path) -> None:
    with PinnedFile(str(path), _etag(path)) as f:
        other = tmp_path / "new.bin"
        other.write_bytes(bytes(len(DATA)))
        os.replace(other, path)
        buf = memoryview(bytearray(64))
        f.read_at(0, [buf])
        assert bytes(buf) == DATA[:64]  # the old inode: never the new file's zeros


def test_a_file_changed_in_place_raises(path: Path) -> None:
    with PinnedFile(str(path), _etag(path)) as f:
        st = path.stat()
        with open(path, "r+b") as w:
            w.write(b"\xff")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        buf = memoryview(bytearray(8))
        with pytest.raises(errors.ObjectChangedError):
            f.read_at(0, [buf])


def test_another_version_at_open_is_refused(path: Path) -> None:
    etag = _etag(path)
    path.write_bytes(DATA + b"more")
    with pytest.raises(errors.ObjectChangedError):
        PinnedFile(str(path), etag)


@pytest.mark.parametrize("offset, size", [(len(DATA) - 4, 5), (len(DATA), 1), (-1, 1)])
def test_a_read_outside_the_file_raises_and_fills_nothing(path: Path, offset: int,
                                                          size: int) -> None:
    with PinnedFile(str(path), _etag(path)) as f:
        buf = memoryview(bytearray(size))
        with pytest.raises(errors.InvalidRangeError):
            f.read_at(offset, [buf])
        assert bytes(buf) == bytes(size)


def test_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFoundError):
        PinnedFile(str(tmp_path), "x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(errors.NotFoundError):  # at once: never waits for a writer
        PinnedFile(str(fifo), "x")
    with pytest.raises(errors.NotFoundError):
        PinnedFile(str(tmp_path / "missing"), "x")


def test_close_is_idempotent_and_reads_after_it_fail(path: Path) -> None:
    f = PinnedFile(str(path), _etag(path))
    f.close()
    f.close()
    with pytest.raises(OSError):
        f.read_at(0, [memoryview(bytearray(1))])
