"""PinnedFile: one version of a local file, read with gathered positional reads."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tensorstream import errors
from tensorstream.providers.local import version
from tensorstream.providers.local.provider import PinnedFile

DATA = bytes(range(256)) * 40  # 10240 bytes


def _etag(path: Path) -> str:
    return version._etag(os.stat(path))


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


# -- a rewrite that puts the old mtime back (rsync -t, cp -p, tar -x) --------------------
def _keeping_mtime(path: Path, change: Any) -> None:
    """``change(path)``, then the file's old atime and mtime put back, as ``rsync -t``,
    ``cp -p`` and ``tar -x`` leave a file they rewrote in place. (After a pause: the
    kernel's file clock is coarse, and the change must be seen to come later.)"""
    st = path.stat()
    time.sleep(0.05)
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_ino == st.st_ino


def _rewrite(path: Path) -> None:
    with open(path, "r+b") as w:
        w.write(bytes(len(DATA)))  # same size, other bytes


def _truncate_and_regrow(path: Path) -> None:
    os.truncate(path, 100)
    with open(path, "r+b") as w:
        w.seek(100)
        w.write(bytes(len(DATA) - 100))


@pytest.mark.parametrize("change", [_rewrite, _truncate_and_regrow])
def test_a_file_changed_in_place_with_its_mtime_put_back_raises(path: Path, change: Any) -> None:
    # Same mtime, size and inode: the version said "unchanged" and the read mixed
    # the two files' bytes. Only the change time, which no user can set, moved.
    with PinnedFile(str(path), _etag(path)) as f:
        buf = memoryview(bytearray(8))
        f.read_at(0, [buf])
        _keeping_mtime(path, change)
        with pytest.raises(errors.ObjectChangedError, match="rsync -t"):
            f.read_at(1000, [buf])


def test_a_change_through_another_hard_link_raises(path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-name.bin"
    os.link(path, other)
    with PinnedFile(str(path), _etag(path)) as f:
        _keeping_mtime(other, _rewrite)  # the same inode, by its other name
        with pytest.raises(errors.ObjectChangedError):
            f.read_at(0, [memoryview(bytearray(8))])


def _chmod(path: Path) -> None:
    path.chmod(0o600 if path.stat().st_mode & 0o044 else 0o644)


def _link(path: Path) -> None:
    os.link(path, path.with_name("a-link.bin"))


def _unlink(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize("change", [_link, _unlink])
def test_a_link_made_or_removed_is_not_a_new_version(path: Path, change: Any) -> None:
    # A hard link made, or the name unlinked (renamed over) while the file is open,
    # moves the change time too, but not the bytes: reads go on (the link count
    # shows it, which a rewrite leaves alone).
    with PinnedFile(str(path), _etag(path)) as f:
        time.sleep(0.05)
        change(path)
        buf = memoryview(bytearray(64))
        f.read_at(100, [buf])
        assert bytes(buf) == DATA[100:164]


def test_a_chmod_mid_read_is_a_change(path: Path) -> None:
    # It cannot be told from cp -p's rewrite (below): the read raises, never mixes.
    with PinnedFile(str(path), _etag(path)) as f:
        time.sleep(0.05)
        _chmod(path)
        with pytest.raises(errors.ObjectChangedError, match="chmod"):
            f.read_at(0, [memoryview(bytearray(8))])


def test_a_rewrite_in_place_with_another_mode_and_the_old_mtime_put_back_raises(
        path: Path) -> None:
    # cp -p from a file of another mode: the bytes rewritten in place, then the mode
    # and the old mtime set. Taken for "metadata only" (the mode moved with the change
    # time), the read handed out the old bytes and then the new ones.
    with PinnedFile(str(path), _etag(path)) as f:
        buf = memoryview(bytearray(8))
        f.read_at(0, [buf])
        _keeping_mtime(path, lambda p: (_rewrite(p), _chmod(p)))
        with pytest.raises(errors.ObjectChangedError, match="cp -p"):
            f.read_at(1000, [buf])


def test_a_chmod_to_the_same_mode_counts_as_a_change(path: Path) -> None:
    # The documented limit: a change of the change time alone cannot be told from a
    # rewrite whose mtime was put back; it errs on the safe side.
    with PinnedFile(str(path), _etag(path)) as f:
        time.sleep(0.05)
        path.chmod(path.stat().st_mode & 0o777)
        with pytest.raises(errors.ObjectChangedError):
            f.read_at(0, [memoryview(bytearray(8))])
