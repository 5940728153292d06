"""The local-destination path of ``cp``: parts received into the temp file
without reading it back, the source's validators checked around the copy, the
resume journal's check of earlier parts, one fsync, and the buffer pool.

``flakytest://`` is a small real provider (registered through the public
``tensorstream.register``) whose reads fail with a temporary error from a
given offset on: the way a network source is cut off mid-copy.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import pytest

import tensorstream
from memory_provider import MemReads
from tensorstream.copy.engine import copy
from tensorstream.errors import ServiceUnavailableError
from tensorstream.providers.base import Capabilities, ObjectInfo, Pin

PART = 64 << 10


class FlakyProvider(MemReads):
    """Read-only in-memory objects; reads at or past ``fail_from`` raise a temporary error."""

    schemes = ("flakytest",)
    service = "flakytest"
    capabilities: ClassVar[Capabilities] = Capabilities()
    store: ClassVar[dict[str, bytes]] = {}
    fail_from: ClassVar[int | None] = None
    #: Only these objects fail (empty: every object).
    fail_only: ClassVar[set[str]] = set()

    def before_read(self, path: str, end: int) -> None:
        failing = not self.fail_only or path in self.fail_only
        if failing and self.fail_from is not None and end > self.fail_from:
            raise ServiceUnavailableError("cut off (test)")


tensorstream.register("flakytest", FlakyProvider, replace=True)


@pytest.fixture
def flaky() -> Iterator[type[FlakyProvider]]:
    yield FlakyProvider
    FlakyProvider.store.clear()
    FlakyProvider.fail_from = None
    FlakyProvider.fail_only = set()


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


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


class ChangingProvider(FlakyProvider):
    """Objects without an ETag (Last-Modified only, like many HTTP servers) whose
    Last-Modified moves once ``change_after`` reads were served."""

    schemes = ("changingtest",)
    service = "changingtest"
    change_after: ClassVar[int] = 1 << 30
    reads: ClassVar[int] = 0

    async def stat(self, path: str) -> ObjectInfo:
        info = await super().stat(path)
        changed = self.reads >= self.change_after
        mtime = datetime(2026, 1, 2 if changed else 1, tzinfo=timezone.utc)
        return ObjectInfo(path, info.size, None, mtime)

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        type(self).reads += 1
        return await super().readinto(path, offset, buffer, pin=pin)


tensorstream.register("changingtest", ChangingProvider, replace=True)


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
    assert _names(out) == []
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


def _interrupted_resume(flaky: type[FlakyProvider], dst: Path, data: bytes) -> str:
    flaky.store["b/m.bin"] = data
    flaky.fail_from = 4 * PART
    first = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=1, resume=True,
                 retries=1)
    assert not first.ok and not dst.exists()
    assert (dst.parent / ".m.bin.tensorstream-journal.tmp").exists()
    flaky.fail_from = None
    return ".m.bin.tensorstream-partial.tmp"


def test_resume_uses_and_checks_earlier_parts(tmp_path: Path,
                                              flaky: type[FlakyProvider]) -> None:
    data = os.urandom(7 * PART + 11)
    dst = tmp_path / "m.bin"
    _interrupted_resume(flaky, dst, data)
    result = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True)
    # Old parts were checked against the journal, not the source: not "verified".
    assert result.ok and not result.verified, result.errors
    # Parts 0-3 were read before the cut; the last may not have reached the journal.
    assert result.resumed_bytes in (3 * PART, 4 * PART)
    assert dst.read_bytes() == data and _names(tmp_path) == ["m.bin"]


def test_a_resumed_durable_copy_writes_its_new_parts_directly(
        tmp_path: Path, flaky: type[FlakyProvider]) -> None:
    from page_cache import direct_io_at, resident_pages

    if not direct_io_at(tmp_path):
        pytest.skip("the temp directory's filesystem has no O_DIRECT")
    data = os.urandom(7 * PART + 11)
    dst = tmp_path / "m.bin"
    _interrupted_resume(flaky, dst, data)
    # Without verification the earlier parts are not read back (which would
    # cache them and, by read-ahead, the rest of the file).
    result = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True,
                  verify=False)
    assert result.ok and result.resumed_bytes, result.errors
    # Both runs' parts went to the disk directly, all but the unaligned tail's page.
    assert resident_pages(dst) <= 1
    assert dst.read_bytes() == data


def test_resume_with_a_damaged_earlier_part_fails_and_starts_over(
        tmp_path: Path, flaky: type[FlakyProvider]) -> None:
    data = os.urandom(7 * PART)
    dst = tmp_path / "m.bin"
    partial = tmp_path / _interrupted_resume(flaky, dst, data)
    with open(partial, "r+b") as f:  # damage part 1, which the journal says is done
        f.seek(PART + 5)
        f.write(bytes([data[PART + 5] ^ 0xFF]))
    result = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True)
    assert not result.ok and "verification failed" in result.errors[0]
    assert _names(tmp_path) == []  # nothing kept: the next run starts over
    again = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True)
    assert again.ok and again.resumed_bytes == 0 and dst.read_bytes() == data


@pytest.mark.timeout(60)
def test_one_failed_object_does_not_starve_the_others(tmp_path: Path,
                                                      flaky: type[FlakyProvider]) -> None:
    # Objects share one buffer pool and one read limit: a failed object must hand
    # back every buffer and read slot it held, or the objects after it wait forever.
    bad, good = ["a", "b", "c", "d", "e"], ["f", "g"]
    for n in bad + good:
        flaky.store[f"b/{n}.bin"] = os.urandom(6 * PART + ord(n))
    flaky.fail_only, flaky.fail_from = {f"b/{n}.bin" for n in bad}, 2 * PART
    dst = tmp_path / "out"
    result = copy([f"flakytest://b/{n}.bin" for n in bad + good], f"{dst}/", part_size=PART,
                  concurrency=2, jobs=1, retries=1)
    assert len(result.errors) == len(bad)
    assert result.files == 2 and _names(dst) == ["f.bin", "g.bin"]
    for n in good:
        assert (dst / f"{n}.bin").read_bytes() == flaky.store[f"b/{n}.bin"]


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


def test_memory_bounded_by_the_buffer_pool(tmp_path: Path) -> None:
    # Peak RSS of a child copying 64 MiB through 1 MiB parts x 2 in flight
    # (+ 1 spare buffer) grows far less than the object size.
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    (tmp_path / "small.bin").write_bytes(b"x" * 1000)
    code = (
        "import resource, sys\n"
        "from tensorstream.copy.engine import copy\n"
        "small, big, out = sys.argv[1:]\n"
        "assert copy(small, out + '.warm').ok\n"  # imports, threads, loop: not counted
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "r = copy(big, out, part_size=1 << 20, concurrency=2)\n"
        "assert r.ok and r.verified, r.errors\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "small.bin"), str(src),
                          str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.strip())
    assert grown_kib < 16 << 10, grown_kib
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()


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


class GatedProvider(FlakyProvider):
    """Objects whose reads past ``gate_at`` wait until the test opens ``gate``."""

    schemes = ("gatedtest",)
    service = "gatedtest"
    gate_at: ClassVar[int] = 0
    gate: ClassVar[threading.Event] = threading.Event()
    waiting: ClassVar[threading.Event] = threading.Event()

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        if offset + len(buffer) > self.gate_at:
            self.waiting.set()
            await asyncio.to_thread(self.gate.wait, 30)
        return await super().readinto(path, offset, buffer, pin=pin)


tensorstream.register("gatedtest", GatedProvider, replace=True)


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
        names = _names(out)
        assert "m.bin" not in names and len(names) == 1 and names[0].startswith(".m.bin.")
    finally:
        GatedProvider.gate.set()
        worker.join(60)
    assert result[0].ok and result[0].verified, result[0].errors
    assert _names(out) == ["m.bin"] and (out / "m.bin").read_bytes() == data


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


class SlowProvider(FlakyProvider):
    """Every read takes 50 ms (a capped link); counts the reads in flight."""

    schemes = ("slowtest",)
    service = "slowtest"
    in_flight: ClassVar[int] = 0
    most: ClassVar[int] = 0

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        cls = type(self)
        cls.in_flight += 1
        cls.most = max(cls.most, cls.in_flight)
        try:
            await asyncio.sleep(0.05)
            return await super().readinto(path, offset, buffer, pin=pin)
        finally:
            cls.in_flight -= 1


tensorstream.register("slowtest", SlowProvider, replace=True)


def test_a_one_part_object_hands_its_read_slot_back_before_the_disk(
        tmp_path: Path, http_server: Any, http_reset: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A read slot covers a read: once an object's bytes are in, the next
    # object's GET goes out while this one is made durable (fsync, rename, the
    # directory's fsync). Here the first object to be fsynced waits until the
    # other object's GET has reached the server; with the one read slot held
    # through the fsync it never would (the wait runs out, the check fails).
    from tensorstream.copy import width

    tag = os.urandom(4).hex()
    keys = {n: f"slot-{tag}/{n}.bin" for n in ("a", "b")}
    data = {n: os.urandom(PART + ord(n)) for n in keys}
    for n, key in keys.items():
        http_server.put(key, data[n])
    seen_during_fsync: list[bool] = []
    real_fsync = os.fsync

    def other_requested(other: str) -> bool:
        for _ in range(500):
            if http_server.requests_for(keys[other], "GET"):
                return True
            time.sleep(0.01)
        return False

    def fsync(fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith((".a.bin.", ".b.bin.")) and not seen_during_fsync:
            seen_during_fsync.append(other_requested("b" if name.startswith(".a.") else "a"))
        real_fsync(fd)

    monkeypatch.setattr(width, "link_bound", lambda before, now: False)  # one slot, always
    monkeypatch.setattr(width, "WAITING", -1.0)
    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "out"
    result = copy([http_server.url(keys["a"]), http_server.url(keys["b"])], f"{out}/",
                  part_size=1 << 20, concurrency=1, jobs=2)
    assert result.ok and result.files == 2 and result.verified, result.errors
    assert seen_during_fsync and all(seen_during_fsync)
    for n in keys:
        assert (out / f"{n}.bin").read_bytes() == data[n]


def test_a_part_is_written_once_per_chunk(tmp_path: Path, http_server: Any,
                                          http_reset: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Each chunk is two thread hand-offs (the receiving thread wakes the worker,
    # which writes it and hands the connection back): a 4 MiB object is four
    # 1 MiB chunks, each written with one pwrite at its place.
    data = os.urandom(4 << 20)
    key = f"chunks/{os.urandom(4).hex()}.bin"
    http_server.put(key, data)
    writes: list[int] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, buf: Any, offset: int) -> int:
        if ".tensorstream-" in os.readlink(f"/proc/self/fd/{fd}"):
            writes.append(len(buf))
        return real_pwrite(fd, buf, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    result = copy(http_server.url(key), str(tmp_path / "c.bin"))
    assert result.ok and result.verified, result.errors
    assert writes == [1 << 20] * 4
    assert (tmp_path / "c.bin").read_bytes() == data


@pytest.mark.parametrize("link_bound", [True, False])
def test_a_copy_waiting_on_its_link_goes_wider(tmp_path: Path, flaky: type[FlakyProvider],
                                               monkeypatch: pytest.MonkeyPatch,
                                               link_bound: bool) -> None:
    # By the idle-machine rule (a source without the receiving thread): when
    # the link is the limit (little CPU used, the machine idle) more parts go
    # in flight, up to four times --concurrency; when the CPU is, the width stays.
    from tensorstream.copy import width

    monkeypatch.setattr(width, "link_bound", lambda before, now: link_bound)
    monkeypatch.setattr(width, "LOOK", 0.02)
    for i in range(40):
        flaky.store[f"b/{i:02d}.bin"] = os.urandom(PART)
    SlowProvider.in_flight = SlowProvider.most = 0
    out = tmp_path / "out"
    # (no jobs given: objects widen with the parts; a number given is kept)
    result = copy([f"slowtest://b/{i:02d}.bin" for i in range(40)], f"{out}/", part_size=PART,
                  concurrency=2)
    assert result.ok and result.files == 40, result.errors
    assert SlowProvider.most == (8 if link_bound else 2)


def test_one_object_keeps_at_most_concurrency_parts_in_flight(
        tmp_path: Path, flaky: type[FlakyProvider], monkeypatch: pytest.MonkeyPatch) -> None:
    # The extra width is for more objects, not more parts of one: a large
    # object copied 4x wide left all of its writeback to the end of a durable
    # copy. Widening is on here (each look says the link is the limit).
    from tensorstream.copy import width

    monkeypatch.setattr(width, "link_bound", lambda before, now: True)
    monkeypatch.setattr(width, "LOOK", 0.02)
    data = os.urandom(PART * 30 + 5)
    flaky.store["b/big.bin"] = data
    SlowProvider.in_flight = SlowProvider.most = 0
    result = copy("slowtest://b/big.bin", str(tmp_path / "big.bin"), part_size=PART,
                  concurrency=2, jobs=2)
    assert result.ok, result.errors
    assert (tmp_path / "big.bin").read_bytes() == data
    assert SlowProvider.most == 2


def test_link_bound_needs_an_idle_machine_and_a_waiting_process() -> None:
    from tensorstream.copy.width import link_bound

    start = (0.0, 0.0, 0, 0)
    # (wall s, process CPU s, machine idle jiffies, machine total jiffies)
    assert link_bound(start, (1.0, 0.2, 60, 100))  # waiting on the link, machine idle
    assert not link_bound(start, (1.0, 0.9, 60, 100))  # this process is busy
    assert not link_bound(start, (1.0, 0.2, 5, 100))  # others keep the machine busy
    assert not link_bound(start, (0.0, 0.0, 0, 0))  # nothing measured


@pytest.mark.parametrize("cut", [None, 1_300_000])
def test_parts_are_received_by_the_shared_receiver_and_resume_exactly(
        tmp_path: Path, http_server: Any, http_reset: None, cut: int | None) -> None:
    # Parts larger than the 1 MiB chunk are received (and written) by the
    # process's receiving thread, one hand-off per part; a body cut part-way
    # has its chunk finished by the retrying read and the rest re-requested,
    # and every byte lands at its place (odd sizes: no part or chunk boundary
    # lines up with another).
    from tensorstream.providers._http import receiver as receiver_mod

    data = os.urandom(7 * (1 << 20) + 12_345)
    key = f"rcv/{os.urandom(4).hex()}.bin"
    http_server.put(key, data)
    if cut is not None:
        http_server.faults.drop_after = cut
        http_server.faults.drop_times = 2
    before = receiver_mod.receiver().receives
    result = copy(http_server.url(key), str(tmp_path / "r.bin"), part_size=(3 << 20) + 7,
                  concurrency=2)
    assert result.ok and result.verified, result.errors
    assert (tmp_path / "r.bin").read_bytes() == data
    assert receiver_mod.receiver().receives > before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.bin"]
    gets = http_server.requests_for(key, "GET")
    assert len(gets) == (3 if cut is None else 3 + 2 * 2)  # 2 cut parts: a resume + the rest


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
    assert _names(out) == []
