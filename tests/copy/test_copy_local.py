"""The local-destination path of ``cp``: parts received into the temp file without reading it
back, nothing visible under the name before the copy is complete, the source's validators
checked around the copy, one fsync, names, permissions and open files. Resume and parts are in
test_copy_local_parts.py, concurrency and memory in test_copy_local_concurrency.py; the
providers (``flakytest://`` and others) in flaky_providers.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from flaky_providers import (
    PART,
    ChangingProvider,
    DatedProvider,
    FlakyProvider,
    GatedProvider,
    names_in,
)

from fuse_mounts import fuse_mount
from tensorstream.copy.engine import copy


def test_the_destination_is_not_read_back(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The temp file is ours alone (O_EXCL, 0600, flocked, held open): reading back
    # what pwrite just put there would only re-prove the kernel's copy, at the
    # cost of a second pass over every byte. Only the source is read.
    src = tmp_path / "src.bin"
    data = os.urandom(5 * PART + 123)
    src.write_bytes(data)
    read_paths: list[str] = []
    real_preadv, real_pread, real_read = os.preadv, os.pread, os.read

    def where(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def preadv(fd: int, buffers: Any, offset: int, *a: Any) -> int:
        read_paths.append(where(fd))
        return real_preadv(fd, buffers, offset, *a)

    def pread(fd: int, n: int, offset: int) -> bytes:
        read_paths.append(where(fd))
        return real_pread(fd, n, offset)

    def read(fd: int, n: int) -> bytes:
        read_paths.append(where(fd))
        return real_read(fd, n)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "read", read)
    result = copy(str(src), str(tmp_path / "m.bin"), part_size=PART, concurrency=3)
    assert result.ok and result.verified, result.errors
    assert (tmp_path / "m.bin").read_bytes() == data
    assert str(src) in read_paths
    assert not [p for p in read_paths if "tensorstream-" in p or p.endswith("m.bin")]


@pytest.mark.parametrize("parts", [1, 6])
def test_a_source_without_etag_changed_during_the_copy_is_caught(
        tmp_path: Path, flaky: type[FlakyProvider], parts: int) -> None:
    # Nothing pins such a source's reads; its validators before and after do.
    # One part: received and published in one worker-thread hop when the answer
    # named its version -- this one did not, so it is checked before publishing.
    flaky.store["b/m.bin"] = os.urandom(parts * PART)
    ChangingProvider.reads, ChangingProvider.change_after = 0, min(parts, 3)
    out = tmp_path / "out"
    out.mkdir()
    result = copy("changingtest://b/m.bin", f"{out}/", part_size=PART, concurrency=2)
    assert not result.ok and "changed" in result.errors[0]
    assert names_in(out) == []
    ChangingProvider.reads, ChangingProvider.change_after = 0, 1 << 30
    result = copy("changingtest://b/m.bin", f"{out}/", part_size=PART, concurrency=2)
    assert result.ok and result.verified, result.errors
    assert (out / "m.bin").read_bytes() == flaky.store["b/m.bin"]


def test_no_verify_is_reported(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(4 * PART))
    result = copy(str(src), str(tmp_path / "m.bin"), part_size=PART, verify=False)
    assert result.ok and not result.verified
    assert (tmp_path / "m.bin").read_bytes() == src.read_bytes()


def test_one_fsync_per_local_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(9 * PART))
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        calls.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    result = copy(str(src), str(tmp_path / "m.bin"), part_size=PART, concurrency=4)
    assert result.ok and result.verified
    assert sorted(calls) == ["dir", "file"]  # the file once, before the rename; then its directory
    assert (tmp_path / "m.bin").read_bytes() == src.read_bytes()
    # durable=False (--no-fsync): published as soon as it is whole, still atomically.
    calls.clear()
    result = copy(str(src), str(tmp_path / "n.bin"), part_size=PART, concurrency=4,
                  durable=False)
    assert result.ok and result.verified and calls == []
    assert (tmp_path / "n.bin").read_bytes() == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin", "n.bin", "src.bin"]


def test_answers_that_name_their_version_need_no_stat_after(
        tmp_path: Path, http_server: Any, http_reset: None) -> None:
    # Every ranged answer carries the ETag it was served under (compared with
    # the pin by the data plane), so the copy is tied to one version without a
    # second HEAD after it: one stat before, one GET per part, nothing else.
    data = os.urandom(4 * PART + 17)
    key = f"named/{os.urandom(4).hex()}.bin"
    http_server.put(key, data)
    result = copy(http_server.url(key), str(tmp_path / "m.bin"), part_size=PART, concurrency=2)
    assert result.ok and result.verified, result.errors
    assert (tmp_path / "m.bin").read_bytes() == data
    assert len(http_server.requests_for(key, "HEAD")) == 1
    assert len(http_server.requests_for(key, "GET")) == 5


@pytest.mark.parametrize("parts", [1, 5])
def test_nothing_is_visible_under_the_name_before_the_copy_is_complete(
        tmp_path: Path, flaky: type[FlakyProvider], parts: int) -> None:
    # The last bytes are held back: while they are, the destination directory
    # holds only the hidden temp file; the name appears with every byte.
    data = os.urandom(parts * PART - 7)
    flaky.store["b/m.bin"] = data
    GatedProvider.gate_at, GatedProvider.gate, GatedProvider.waiting = (
        len(data) - 1, threading.Event(), threading.Event())
    out = tmp_path / "out"
    out.mkdir()
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(
        copy("gatedtest://b/m.bin", f"{out}/", part_size=PART, concurrency=2)))
    worker.start()
    try:
        assert GatedProvider.waiting.wait(30)
        names = names_in(out)
        assert "m.bin" not in names and len(names) == 1 and names[0].startswith(".m.bin.")
    finally:
        GatedProvider.gate.set()
        worker.join(60)
    assert result[0].ok and result[0].verified, result[0].errors
    assert names_in(out) == ["m.bin"] and (out / "m.bin").read_bytes() == data


def test_each_destination_directory_is_listed_once(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Temp files of earlier runs are looked for once per directory, not once per
    # object (n objects into one directory were n listings of up to n entries).
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(12):
        (src / f"{i:02d}.bin").write_bytes(os.urandom(1000 + i))
        (src / "sub" / f"{i:02d}.bin").write_bytes(os.urandom(2000 + i))
    dst = tmp_path / "dst"
    stale = dst / "sub" / ".05.bin.tensorstream-0123456789ab.tmp"  # a killed run's leftover
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    listed: list[str] = []
    real_listdir = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        if isinstance(path, int):
            listed.append(os.readlink(f"/proc/self/fd/{path}"))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    result = copy(str(src), f"{dst}/", recursive=True, concurrency=4)
    assert result.ok and result.files == 24, result.errors
    assert sorted(listed) == [str(dst), str(dst / "sub")]
    assert not stale.exists()  # still found and removed
    for p in src.rglob("*.bin"):
        assert (dst / p.relative_to(src)).read_bytes() == p.read_bytes()


@pytest.mark.parametrize("spelling", ["path", "file-uri"])
def test_a_local_file_named_with_a_question_mark_keeps_its_name(tmp_path: Path,
                                                                spelling: str) -> None:
    # The destination's name was cut at the '?' (as for an HTTP URL's query):
    # "cp 'd/q?m' out/" wrote out/q, over a neighbour of that name.
    src = tmp_path / "src"
    src.mkdir()
    (src / "q?m").write_bytes(b"the file q?m")
    (src / "q").write_bytes(b"the file q")
    given = f"{src}/q?m" if spelling == "path" else f"file://{src}/q%3Fm"
    out = tmp_path / "out"
    result = copy(given, f"{out}/")
    assert result.ok, result.errors
    assert sorted(p.name for p in out.iterdir()) == ["q?m"]
    assert (out / "q?m").read_bytes() == b"the file q?m"


def test_a_local_copy_takes_its_sources_permissions_less_the_umask(tmp_path: Path) -> None:
    # As cp, rsync and shutil.copy: a private source (0600) was copied 0644,
    # readable by every user. One part and many, one file and a folder.
    src = tmp_path / "src"
    src.mkdir()
    modes = {"private.bin": 0o600, "group.bin": 0o640, "run.sh": 0o755, "ro.bin": 0o444}
    for i, (name, mode) in enumerate(modes.items()):
        (src / name).write_bytes(os.urandom(10 + i * 50_000))
        (src / name).chmod(mode)
    old = os.umask(0o022)
    try:
        result = copy(f"{src}/", f"{tmp_path}/tree/", recursive=True, part_size=32 << 10)
        assert result.ok, result.errors
        assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "tree").iterdir()} == modes
        os.umask(0o077)
        result = copy(str(src / "group.bin"), str(tmp_path / "one.bin"))
        assert result.ok, result.errors
        assert (tmp_path / "one.bin").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_a_filesystem_that_reports_no_size_is_not_full(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # ramfs reports 0 blocks of 0 free (it grows as it is written; `mount -t
    # ramfs`): every copy into it was refused "not enough space ... 0 free".
    real = os.statvfs
    ramfs = os.statvfs_result((4096, 4096, 0, 0, 0, 0, 0, 0, 4096, 255))
    monkeypatch.setattr(os, "statvfs", lambda p: ramfs if isinstance(p, int) else real(p))
    data = os.urandom(3 * PART + 5)
    (tmp_path / "src.bin").write_bytes(data)
    result = copy(str(tmp_path / "src.bin"), str(tmp_path / "out/dst.bin"), part_size=PART)
    assert result.ok, result.errors
    assert (tmp_path / "out/dst.bin").read_bytes() == data


def test_a_folder_of_many_files_copies_under_a_low_open_file_limit(tmp_path: Path) -> None:
    # The local provider kept every source file it had read open until the copy
    # ended: cp -r of a folder failed with "Too many open files" past the limit
    # (about 1000 files under the common 1024). Now at most a few stay open.
    import resource

    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"f{i:03d}").write_bytes(i.to_bytes(2, "big") * 50)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, now + 200), hard))
    try:
        result = copy(f"{src}/", f"{tmp_path}/dst/", recursive=True)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.ok and result.files == 400, result.errors[:3]
    assert (tmp_path / "dst/f399").read_bytes() == (399).to_bytes(2, "big") * 50


def test_a_local_source_rewritten_with_its_mtime_put_back_is_not_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rsync -t / cp -p rewrite in place and put the old mtime back: same mtime,
    # size and inode, so the copy published the first parts of one version and
    # the rest of the other. The change time moved: the copy fails, publishes nothing.
    src = tmp_path / "src.bin"
    data = os.urandom(8 * PART)
    src.write_bytes(data)
    st = src.stat()
    real_preadv, calls = os.preadv, []

    def preadv(fd: int, buffers: Any, offset: int, *a: int) -> int:
        calls.append(offset)
        if len(calls) == 3:
            time.sleep(0.05)  # (the file clock is coarse)
            with open(src, "r+b") as f:
                f.write(bytes(len(data)))
            os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        return real_preadv(fd, buffers, offset, *a)

    monkeypatch.setattr(os, "preadv", preadv)
    out = tmp_path / "out"
    out.mkdir()
    result = copy(str(src), f"{out}/", part_size=PART, concurrency=1)
    assert not result.ok and "changed" in result.errors[0], result.errors
    assert names_in(out) == []


@pytest.fixture
def dated() -> Iterator[type[DatedProvider]]:
    DatedProvider.store.update({"b/x/one.bin": b"1" * 100, "b/x/two.bin": b"2" * 200})
    yield DatedProvider
    DatedProvider.store.clear()
    DatedProvider.mtime = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _date_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "date could not be given" in r.getMessage()]


def test_a_date_the_filesystem_cannot_hold_is_said_once_and_sync_copies_again(
        dated: type[DatedProvider], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A source dated the year 3000 (a server's Last-Modified): ext4 keeps dates up to
    # 2446 and clamps the rest without an error (XFS without bigtime: 2038). The copy
    # kept the clamped date silently, and every sync took the files as changed and
    # copied them again, unexplained.
    dated.mtime = datetime(3000, 1, 1, tzinfo=timezone.utc)
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    when_ns = int(dated.mtime.timestamp()) * 10**9
    os.utime(probe, ns=(when_ns, when_ns))
    if probe.stat().st_mtime_ns == when_ns:
        pytest.skip("this filesystem holds dates of the year 3000 (tmpfs, btrfs)")
    dst = tmp_path / "dst"
    for _run in range(2):
        caplog.clear()
        r = copy("datedtest://b/x/", f"{dst}/", recursive=True, skip_unchanged=True)
        assert r.ok, r.errors
        # what sync does next time: the dates differ, so both are copied again
        assert sorted(o.status for o in r.outcomes) == ["copied", "copied"]
        said = _date_warnings(caplog)
        assert len(said) == 1, said  # once a run, not once a file
        assert "sync compares dates and will copy" in said[0]
        assert "the filesystem keeps" in said[0]
    assert (dst / "two.bin").read_bytes() == b"2" * 200


def test_a_date_the_filesystem_refuses_is_said(
        dated: type[DatedProvider], tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What a FUSE, 9p or SMB mount (or a file owned by another user) answers: EPERM.
    # (os.utime stands in for the filesystem; root may date any file here.)
    def refused(*a: Any, **kw: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "utime", refused)
    r = copy("datedtest://b/x/", f"{tmp_path}/dst/", recursive=True)
    assert r.ok and r.files == 2, r.errors
    said = _date_warnings(caplog)
    assert len(said) == 1 and "(Operation not permitted)" in said[0], said
    assert (tmp_path / "dst" / "one.bin").read_bytes() == b"1" * 100


def test_a_mount_that_refuses_dates_is_said_once_and_sync_copies_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A real filesystem that answers EPERM to utime (a FUSE mount: tests/case_folding_fs.py
    # --refuse-dates), from a local source folder.
    mounts = fuse_mount(tmp_path, "--refuse-dates")
    mnt = next(mounts)
    try:
        src = tmp_path / "src"
        src.mkdir()
        for name in ("one.bin", "two.bin"):
            (src / name).write_bytes(name.encode() * 100)
        for _run in range(2):
            caplog.clear()
            r = copy(str(src), f"{mnt}/out/", recursive=True, skip_unchanged=True)
            assert r.ok and sorted(o.status for o in r.outcomes) == ["copied", "copied"]
            said = _date_warnings(caplog)
            assert len(said) == 1 and "(Operation not permitted)" in said[0], said
        assert (mnt / "out" / "two.bin").read_bytes() == b"two.bin" * 100
    finally:
        mounts.close()


def test_a_date_carried_says_nothing_and_sync_skips(
        dated: type[DatedProvider], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for statuses in (["copied", "copied"], ["skipped", "skipped"]):
        r = copy("datedtest://b/x/", f"{tmp_path}/dst/", recursive=True, skip_unchanged=True)
        assert r.ok and sorted(o.status for o in r.outcomes) == statuses, r.outcomes
    assert not _date_warnings(caplog)
