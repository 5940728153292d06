"""Local-disk provider: conformance plus local-only behaviour."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from reliability_helpers import file_size_limit
from tensorstream import errors
from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance
from tmpfs import mounted_tmpfs


class TestLocalConformance(ProviderConformance):
    @pytest.fixture
    def target(self, tmp_path: Path) -> ConformanceTarget:
        def put(key: str, data: bytes) -> None:
            p = tmp_path / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

        def uri(key: str) -> str:
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            return str(tmp_path / key)

        return ConformanceTarget(uri=uri, put=put)


def test_file_uri_and_bare_path_agree(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"hello world")
    with tensorstream.open(f"file://{p}") as a, tensorstream.open(str(p)) as b:
        assert a.read() == b.read() == b"hello world"


def test_truncated_file_mid_read_never_zero_fills(tmp_path: Path) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(os.urandom(1 << 20))
    with tensorstream.open(p, retries=1) as f:
        os.truncate(p, 1000)
        with pytest.raises((errors.ObjectChangedError, errors.InvalidRangeError)):
            f.read()


def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), tensorstream.open(dst, "wb") as w:
        w.write(b"x" * 100)
        raise RuntimeError("fail")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_names_the_destination_and_publishes_nothing(tmp_path: Path) -> None:
    """A write the disk has no room for (here: past RLIMIT_FSIZE, EFBIG; ENOSPC
    alike) was a bare "[Errno 28] No space left on device": which file, which
    disk? It names the destination now, keeps its errno, and nothing is left."""
    dst = tmp_path / "out.bin"
    with file_size_limit(1 << 20), pytest.raises(OSError) as info, \
            tensorstream.open(dst, "wb") as w:
        w.write(os.urandom(3 << 20))
    assert info.value.errno == errno.EFBIG and info.value.filename == str(dst), info.value
    assert "nothing was published" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_dropped_writer_is_not_published(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    w = tensorstream.open(dst, "wb")
    w.write(b"partial")
    del w
    import gc

    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_written_file_gets_normal_permissions(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    with tensorstream.open(dst, "wb") as w:
        w.write(b"abc")
    umask = os.umask(0)
    os.umask(umask)
    assert (dst.stat().st_mode & 0o777) == (0o666 & ~umask)


# -- the atomic writer's abort is final ------------------------------------------------
# Its writes and commit run in threads, which cannot be stopped: an abort that
# did not wait for them closed the descriptor under a write (whose bytes then
# went to whatever file reused the number) and let a rename finish after it.


def _hold(monkeypatch: pytest.MonkeyPatch, name: str, when: Any) -> tuple[Any, Any]:
    """``os.<name>`` waits on a gate once ``when(*args)`` holds (then ``entered``)."""
    import threading

    entered, gate = threading.Event(), threading.Event()
    real = getattr(os, name)

    def held(*args: Any, **kw: Any) -> Any:
        if not entered.is_set() and when(*args):
            entered.set()
            gate.wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(os, name, held)
    return entered, gate


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_an_abort_waits_for_a_write_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The descriptor a held write uses stays the temp file's while the abort
    runs (closed, its number would go to the next file opened, which would
    get the write), and nothing is left once the write ends."""
    import asyncio

    size = 123_457  # the write held, told apart by its length
    fds: list[int] = []
    entered, gate = _hold(monkeypatch, "write",
                          lambda fd, data: len(data) == size and not fds.append(fd))
    provider = tensorstream.get_provider(str(tmp_path))
    w = provider.open_writer(str(tmp_path / "m.bin"))
    await w.write(b"first")
    write = asyncio.ensure_future(w.write(b"w" * size))
    try:
        await asyncio.to_thread(entered.wait, 10)
        write.cancel()
        abort = asyncio.ensure_future(w.abort())
        await asyncio.sleep(0.2)  # an abort that does not wait has closed it by now
        try:
            target = os.readlink(f"/proc/self/fd/{fds[0]}")
        except OSError:
            target = "(closed)"
        assert os.path.basename(target).startswith(".m.bin"), target
    finally:
        gate.set()
    await asyncio.gather(write, return_exceptions=True)
    await abort
    assert list(tmp_path.iterdir()) == []


async def test_a_commit_stopped_after_its_rename_is_removed_by_the_abort(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import stat

    dst = tmp_path / "m.bin"
    # Held at the directory's fsync: the temp file is already renamed over dst.
    entered, gate = _hold(monkeypatch, "fsync", lambda fd: stat.S_ISDIR(os.fstat(fd).st_mode))
    provider = tensorstream.get_provider(str(tmp_path))
    w = provider.open_writer(str(dst))
    await w.write(b"x" * 1000)
    commit = asyncio.ensure_future(w.commit())
    await asyncio.to_thread(entered.wait, 10)
    assert dst.exists()  # published; the commit has not returned
    commit.cancel()
    await asyncio.sleep(0.2)  # an abort that does not wait has finished by now
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await commit
    await w.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_a_proc_file_whose_size_says_zero_is_refused(tmp_path: Path) -> None:
    # /proc/self/status says 0 bytes and has some: open() read b"", and cp
    # published an empty copy and reported it copied.
    from tensorstream.copy.engine import copy

    proc = "/proc/self/status"
    assert os.stat(proc).st_size == 0
    with pytest.raises(errors.NotFoundError, match="size is not known"):
        tensorstream.open(proc)
    for dst in (f"{tmp_path}/status", f"{tmp_path}/tree/"):
        result = copy(proc, dst, recursive=dst.endswith("/"))
        assert not result.ok and result.files == 0
        assert "size is not known" in str(result.errors[0])
    assert list(tmp_path.iterdir()) == []
    folder = "/proc/sys/kernel/random/"  # a folder of such files: each one said, no more
    if os.path.isdir(folder):
        result = copy(folder, f"{tmp_path}/tree/", recursive=True)
        assert not result.ok and result.files == 0 and result.errors
        assert all("size is not known" in e for e in result.errors), result.errors
    # A file that really is empty is still one.
    (tmp_path / "empty").write_bytes(b"")
    with tensorstream.open(tmp_path / "empty") as f:
        assert f.read() == b""
    result = copy(str(tmp_path / "empty"), str(tmp_path / "copy"))
    assert result.ok and (tmp_path / "copy").read_bytes() == b""


@pytest.fixture
def readonly_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only filesystem (a tmpfs mounted ro: needs root)."""
    yield from mounted_tmpfs(tmp_path / "ro", "ro,size=1m",
                             "cannot mount a tmpfs here (needs root)")


def test_a_read_only_filesystem_is_said_of_the_destination(readonly_dir: Path,
                                                           tmp_path: Path) -> None:
    # The writer's abort unlinked a temp file it never created, which on a
    # read-only filesystem fails too (EROFS, not ENOENT): that error took the
    # place of the real one, naming '.x.tensorstream-....tmp'. serialize and
    # convert did the same; cp named the temp file.
    import torch

    from tensorstream.copy.engine import copy

    dst = readonly_dir / "x.bin"
    with pytest.raises(OSError) as info:
        with tensorstream.open(dst, "wb") as w:
            w.write(b"weights")
    assert info.value.errno == errno.EROFS and info.value.filename == str(dst), info.value
    sd = {"w": torch.arange(4.0)}
    tensorstream.safetensors.save(sd, tmp_path / "m.safetensors")
    for write in (lambda: tensorstream.serialize(sd, str(readonly_dir / "m.tensors")),
                  lambda: tensorstream.convert(str(tmp_path / "m.safetensors"),
                                               str(readonly_dir / "m.tensors"))):
        with pytest.raises(OSError) as info:
            write()
        # the first error, not one raised while cleaning up after it
        assert info.value.errno == errno.EROFS and info.value.__context__ is None, info.value
    (tmp_path / "src.bin").write_bytes(b"weights")
    result = copy(str(tmp_path / "src.bin"), str(dst))
    assert not result.ok
    assert "cannot create 'x.bin'" in result.errors[0] and ".tmp" not in result.errors[0]
    assert list(readonly_dir.iterdir()) == []


@pytest.mark.parametrize("name", ["w" * 255, "w" * 226, "\u00e9" * 127, "w" * 250 + ".bin"])
def test_local_writes_take_any_name_the_filesystem_takes(tmp_path: Path, name: str) -> None:
    # The temp file beside the destination was named ".NAME.tensorstream-XXXX.tmp",
    # too long for a name of 225-255 bytes: open(path, "wb"), safetensors.save,
    # serialize and convert failed ("the name is too long") where cp succeeded.
    import torch

    assert len(os.fsencode(name)) <= 255
    dst = tmp_path / "out" / name
    dst.parent.mkdir()
    with tensorstream.open(dst, "wb") as w:
        w.write(b"weights")
    assert dst.read_bytes() == b"weights"
    sd = {"w": torch.arange(4.0)}
    tensorstream.safetensors.save(sd, dst)
    assert torch.equal(tensorstream.safetensors.load(dst)["w"], sd["w"])
    tensorstream.serialize(sd, dst)
    assert torch.equal(tensorstream.deserialize(dst)["w"], sd["w"])
    tensorstream.convert(dst, tmp_path / "m.safetensors")
    tensorstream.convert(tmp_path / "m.safetensors", dst, overwrite=True)
    assert torch.equal(tensorstream.deserialize(dst)["w"], sd["w"])
    with pytest.raises(RuntimeError), tensorstream.open(dst, "wb") as w:
        w.write(b"partial")
        raise RuntimeError("fail")
    assert os.listdir(dst.parent) == [name]  # no temp file left, the file as it was


def test_a_writer_is_not_taken_for_a_dead_run_by_a_copy_to_its_name(tmp_path: Path) -> None:
    """``cp``/``sync`` removes the temp files of its destination name that no live
    process holds locked (a killed run's). The local writer's temp file was not locked:
    a copy to the name while ``open(path, "wb")`` (serialize, convert, safetensors'
    save) wrote it removed it, and the writer's close failed with 'No such file or
    directory: .../.a.bin.tensorstream-<hex>.tmp'. Now the later of the two wins whole."""
    from tensorstream.copy.engine import copy

    (tmp_path / "src.bin").write_bytes(b"copied")
    dst = tmp_path / "dst"
    dst.mkdir()
    f = tensorstream.open(str(dst / "a.bin"), "wb")
    f.write(b"w" * (16 << 20))  # past the buffer: the temp file exists
    f.flush()
    assert len(os.listdir(dst)) == 1
    result = copy(str(tmp_path / "src.bin"), str(dst / "a.bin"))
    assert result.ok, result.errors
    assert (dst / "a.bin").read_bytes() == b"copied"
    f.close()
    assert (dst / "a.bin").read_bytes() == b"w" * (16 << 20)
    assert os.listdir(dst) == ["a.bin"]


def test_a_rewrite_that_put_the_old_mtime_back_is_never_mixed(tmp_path: Path) -> None:
    # rsync -t / cp -p: same mtime, size and inode; the second read returned the
    # new file's bytes after the first one's old ones.
    p = tmp_path / "m.bin"
    data = os.urandom(1 << 20)
    p.write_bytes(data)
    with tensorstream.open(p, retries=1) as f:
        assert f.read(1000) == data[:1000]
        st = p.stat()
        time.sleep(0.05)  # (the file clock is coarse)
        with open(p, "r+b") as w:
            w.write(bytes(len(data)))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        f.seek(500_000)
        with pytest.raises(errors.ObjectChangedError, match="change time"):
            f.read(1000)
