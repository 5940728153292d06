"""A durable local destination's last steps (``copy/sinks.py``, ``copy/part_file.py``): the group
commit of directory fsyncs, and what a crash can leave behind.

The guarantee checked: an object reported copied has its bytes fsynced before
its rename and an ``fsync`` of its directory that *started after* its rename
returned before the report; a process killed at any moment leaves no partial
file under a final name.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tensorstream.copy import part_file, sinks
from tensorstream.copy.engine import copy
from tensorstream.copy.sinks import DirectorySync


def _dir_fd(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_an_fsync_in_progress_does_not_cover_a_later_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A's fsync starts and blocks; B renames while it runs. B must not return
    # on A's fsync (it may have missed B's rename), only on one issued after.
    group = DirectorySync()
    started: list[int] = []
    release_first = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        started.append(fd)
        if len(started) == 1:
            assert release_first.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fd_a, fd_b = _dir_fd(tmp_path), _dir_fd(tmp_path)
    returned: list[str] = []
    a = threading.Thread(target=lambda: (group.sync(fd_a), returned.append("a")))
    a.start()
    for _ in range(500):
        if started:
            break
        time.sleep(0.01)
    assert started == [fd_a]  # A's fsync is in progress
    b = threading.Thread(target=lambda: (group.sync(fd_b), returned.append("b")))
    b.start()
    time.sleep(0.2)
    assert returned == [] and len(started) == 1  # B waits for A's fsync, then its own
    release_first.set()
    a.join(10)
    b.join(10)
    assert sorted(returned) == ["a", "b"]
    assert started == [fd_a, fd_b]  # a second fsync, started after B's ticket
    os.close(fd_a)
    os.close(fd_b)


def test_waiting_renames_share_one_fsync(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # While one fsync of the directory runs, every thread that arrives waits;
    # the next fsync covers all of them: 1 + 1 calls for 9 threads, not 9.
    group = DirectorySync()
    calls: list[float] = []
    gate = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            assert gate.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fds = [_dir_fd(tmp_path) for _ in range(9)]
    threads = [threading.Thread(target=group.sync, args=(fd,)) for fd in fds]
    threads[0].start()
    for _ in range(500):
        if calls:
            break
        time.sleep(0.01)
    for t in threads[1:]:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 2
    assert group._dirs == {}  # nothing kept for a directory nobody waits on
    for fd in fds:
        os.close(fd)


def _until(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_a_late_waiter_never_forgets_a_newer_fsync_in_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # B waits on A's fsync and wakes late: meanwhile C's fsync covered B and
    # the directory was forgotten, and D began one anew. B then forgot the
    # directory again, D's fsync and all: E started a second fsync of it while
    # D's ran (two at once, what the group commit is there to avoid; the
    # folder copy test saw its fsyncs overlap and failed now and then).
    group = DirectorySync()
    late = threading.Event()
    woken = threading.Event()

    class LateWake(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            got = super().wait(timeout)
            if threading.current_thread().name == "B" and not woken.is_set():
                woken.set()  # (any wait may return late: here B's, on purpose)
                self.release()
                assert late.wait(10)
                self.acquire()
            return got

    group._cond = LateWake()
    gates: dict[str, threading.Event] = {"A": threading.Event(), "D": threading.Event()}
    running: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        me = threading.current_thread().name
        if running:
            overlaps.append((*running, me))
        running.append(me)
        if me in gates:
            assert gates[me].wait(10)
        real_fsync(fd)
        running.remove(me)

    monkeypatch.setattr(os, "fsync", fsync)
    fd = _dir_fd(tmp_path)
    threads: dict[str, threading.Thread] = {}

    def start(name: str) -> None:
        threads[name] = threading.Thread(target=group.sync, args=(fd,), name=name)
        threads[name].start()

    start("A")
    _until(lambda: running == ["A"])
    start("B")
    _until(lambda: sum(s[0] for s in group._dirs.values()) == 2)  # B holds a ticket
    gates["A"].set()
    threads["A"].join(10)
    assert woken.wait(10)  # B is awake but not yet back in the loop
    start("C")
    threads["C"].join(10)  # C's fsync covered B's ticket too
    start("D")
    _until(lambda: running == ["D"])
    late.set()
    threads["B"].join(10)
    start("E")
    _until(lambda: "E" in running or any(s[0] == 2 for s in group._dirs.values()))
    gates["D"].set()
    for t in threads.values():
        t.join(10)
    os.close(fd)
    assert overlaps == []
    assert group._dirs == {}


def test_each_copied_object_is_covered_by_a_later_directory_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A folder copied with fsync on: every file is fsynced before its rename,
    # and before the copy reports it done, a directory fsync that started after
    # its rename has returned; there are fewer directory fsyncs than files.
    src = tmp_path / "src"
    src.mkdir()
    data = {f"{i:02d}.bin": os.urandom(20_000 + i) for i in range(24)}
    for name, body in data.items():
        (src / name).write_bytes(body)
    dst = tmp_path / "dst"
    lock = threading.Lock()
    events: list[tuple[str, str, int]] = []  # (what, name, sequence number)
    seq = iter(range(1 << 30))
    real_fsync, real_replace = os.fsync, os.replace

    def note(what: str, name: str) -> None:
        with lock:
            events.append((what, name, next(seq)))

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        note("dir-start" if is_dir else "file", target)
        time.sleep(0.002)  # a disk that takes its time: renames pile up meanwhile
        real_fsync(fd)
        if is_dir:
            note("dir-end", target)

    def replace(a: str, b: str, **kw: object) -> None:
        note("tmp-fsynced-before-rename", str(a))
        real_replace(a, b, **kw)  # type: ignore[arg-type]
        note("renamed", str(b))

    class Reports:
        def start(self, files: int, total: int) -> None: ...
        def file_started(self, name: str, size: int) -> None: ...
        def advance(self, name: str, nbytes: int) -> None: ...
        def file_finished(self, name: str, ok: bool) -> None:
            assert ok
            note("reported", os.path.basename(name))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    result = copy(f"{src}/", f"{dst}/", recursive=True, concurrency=8, jobs=8,
                  progress=Reports())
    assert result.ok and result.files == len(data), result.errors
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == data
    renamed = {name: n for what, name, n in events if what == "renamed"}
    reported = {name: n for what, name, n in events if what == "reported"}
    files = {os.path.basename(name): n for what, name, n in events if what == "file"}
    dir_syncs: list[tuple[int, int]] = []
    open_starts: dict[str, list[int]] = {}
    for what, name, n in events:
        if what == "dir-start":
            open_starts.setdefault(name, []).append(n)
        elif what == "dir-end":
            dir_syncs.append((open_starts[name].pop(0), n))
    for name in data:
        tmp_fsync = [n for tmp, n in files.items() if tmp.startswith(f".{name}.")]
        assert tmp_fsync and tmp_fsync[0] < renamed[name]
        assert any(renamed[name] < start and end < reported[name] for start, end in dir_syncs), \
            name
    assert len(dir_syncs) < len(data)


_KILLED_CP = r"""
import sys
from tensorstream.cli.main import main
sys.exit(main(["cp", "--json", "-r", "--jobs", "16", "--concurrency", "16", sys.argv[1], sys.argv[2]]))
"""


def test_a_killed_folder_copy_leaves_only_whole_files(tmp_path: Path) -> None:
    # SIGKILL while objects are being published: whatever has a final name is
    # whole, and everything reported copied before the kill is there.
    src = tmp_path / "src"
    src.mkdir()
    data = {f"{i:03d}.bin": os.urandom(200_000 + i) for i in range(150)}
    for name, body in data.items():
        (src / name).write_bytes(body)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + \
        env.get("PYTHONPATH", "")
    for attempt in range(3):
        dst = tmp_path / f"dst{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_CP, f"{src}/", f"{dst}/"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        assert proc.stdout is not None
        reported: list[str] = []
        for line in proc.stdout:
            record = json.loads(line)
            if record.get("status") == "copied":
                reported.append(os.path.basename(record["dst"]))
            if len(reported) >= 10 + 20 * attempt:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(60)
        proc.stdout.close()
        finals = [p for p in dst.iterdir() if not p.name.startswith(".")] if dst.exists() else []
        for p in finals:
            assert p.read_bytes() == data[p.name], p.name
        assert set(reported) <= {p.name for p in finals}
        if proc.returncode == -signal.SIGKILL:
            assert len(finals) < len(data) or attempt > 0


def test_the_process_wide_group_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A durable publish goes through the shared group commit (one per process).
    seen: list[int] = []
    real = sinks.directory_sync.sync
    monkeypatch.setattr(sinks.directory_sync, "sync", lambda fd: (seen.append(fd), real(fd)))
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    result = copy(str(tmp_path / "a.bin"), str(tmp_path / "b.bin"))
    assert result.ok and len(seen) == 1
    result = copy(str(tmp_path / "a.bin"), str(tmp_path / "c.bin"), durable=False)
    assert result.ok and len(seen) == 1


@pytest.mark.parametrize("name", ["m.bin", "a" * 224, "a" * 225, "b" * 255, "\u00e9" * 127,
                                  "x" * 200 + "\u00e9" * 27, "s\udcff" * 100])
def test_temp_names_fit_a_directory_entry(name: str) -> None:
    """Every temp file name of a copy (``stem + 0123456789ab.tmp``, ``journal.new.tmp``...)
    fits in 255 bytes whatever the length of the destination's name; short names keep
    the readable ``.NAME.tensorstream-`` stem."""
    from tensorstream.copy.keys import is_temp_name
    from tensorstream.copy.sinks import temp_stem

    stem = temp_stem(name)
    for end in ("0123456789ab.tmp", "partial.tmp", "journal.tmp", "journal.new.tmp"):
        assert len(os.fsencode(stem + end)) <= 255
        assert is_temp_name(stem + end)
    if len(os.fsencode(name)) <= 224:
        assert stem == f".{name}.tensorstream-"
    assert temp_stem(name + "z") != stem


def test_publishing_never_sets_the_process_umask(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each publish read the umask with ``os.umask(0); os.umask(u)``: for that moment the
    whole process had umask 0 (another thread's new files and directories world-writable),
    and two publishing at once could leave it at 0 for good. The copies still get the
    mode a new file gets (0666 less the umask)."""
    import tensorstream

    old = os.umask(0o027)
    try:
        set_to: list[int] = []
        real = os.umask

        def spy(mask: int) -> int:
            set_to.append(mask)
            return real(mask)

        monkeypatch.setattr(os, "umask", spy)
        src = tmp_path / "src"
        src.mkdir()
        for i in range(8):
            (src / f"f{i}.bin").write_bytes(os.urandom(70_000 if i % 2 else 10))
        result = copy(str(src), str(tmp_path / "dst"), recursive=True, part_size=32 << 10)
        assert result.ok, result.errors
        with tensorstream.open(str(tmp_path / "w.bin"), "wb") as f:  # the local writer
            f.write(b"w")
        monkeypatch.undo()
        assert 0 not in set_to
        if os.path.exists("/proc/self/status"):
            assert set_to == []  # read, never set
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "dst").iterdir()}
        assert set(modes.values()) == {0o640}, modes
        assert (tmp_path / "w.bin").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_the_umask_is_read_as_set(tmp_path: Path) -> None:
    from tensorstream._umask import current_umask, new_file_mode

    old = os.umask(0o037)
    try:
        assert current_umask() == 0o037 and new_file_mode() == 0o640
        assert os.umask(0o037) == 0o037  # left as it was
    finally:
        os.umask(old)


# -- two runs copying to one name at once (``tensorstream sync`` twice, a cron job
# and a person, every node of a cluster staging one model on a shared volume) --

def _run_file(dir_fd: int, name: str, size: int, **kw: object) -> part_file.LocalPartFile:
    """One run's temp file for ``name``, as a copy makes it (the directory listed at open)."""
    args: dict = dict(size=size, part_size=1 << 20, source="src", etag='"e1"', resume=False,
                      durable=False, direct=False)
    args.update(kw)
    return part_file.LocalPartFile(dir_fd, name, **args)


def _fill(part: part_file.LocalPartFile, data: bytes) -> None:
    part.open()
    with part.writing() as write:
        write(0, memoryview(data))


def test_a_run_publishing_is_never_taken_for_a_dead_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The lock on a temp file was let go before its rename: another run starting
    # in between found the file unlocked, took it for a SIGKILLed run's and
    # removed it, and the rename failed ('No such file or directory: .m.bin.
    # tensorstream-<hex>.tmp -> m.bin'; 1 in 40 of 4-8 'sync' runs at once).
    # Here the second run starts exactly there.
    dir_fd = _dir_fd(tmp_path)
    try:
        a, b = _run_file(dir_fd, "m.bin", 5), _run_file(dir_fd, "m.bin", 5)
        _fill(a, b"first")
        real = os.replace
        started: list[bool] = []

        def rename_after_another_run_starts(*args: object, **kw: object) -> None:
            if not started:
                started.append(True)
                _fill(b, b"other")  # its scan for a dead run's temp files runs here
            real(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "replace", rename_after_another_run_starts)
        a.publish()
        assert started and (tmp_path / "m.bin").read_bytes() == b"first"
        b.publish()
        assert (tmp_path / "m.bin").read_bytes() == b"other"
        assert os.listdir(tmp_path) == ["m.bin"]  # nothing left behind
    finally:
        os.close(dir_fd)


def test_a_new_temp_file_removed_before_its_lock_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between creating its temp file and locking it, a run's file looks like a
    # dead run's to another run's scan, which removes it. The run wrote into
    # a file without a name and failed at the rename ('No such file or
    # directory', or 'has another name (a hard link)' as its link count was 0);
    # now it sees that the name is gone and takes a new one.
    dir_fd = _dir_fd(tmp_path)
    try:
        a, b = _run_file(dir_fd, "m.bin", 5), _run_file(dir_fd, "m.bin", 5)
        real = fcntl.flock
        scans: list[str] = []

        def lock_after_another_run_scans(fd: int, op: int) -> None:
            if not scans:
                scans.append(sorted(os.listdir(tmp_path))[0])
                b.open()  # another run starts: its scan removes a's unlocked file
            real(fd, op)

        monkeypatch.setattr(fcntl, "flock", lock_after_another_run_scans)
        first = a.tmp
        _fill(a, b"first")
        a.publish()
        assert (tmp_path / "m.bin").read_bytes() == b"first"
        assert scans == [first] and a.tmp != first  # removed, and made again
        with b.writing() as write:
            write(0, memoryview(b"other"))
        b.publish()
        assert (tmp_path / "m.bin").read_bytes() == b"other"
        assert os.listdir(tmp_path) == ["m.bin"]
    finally:
        os.close(dir_fd)


def test_a_failed_resumable_copy_removes_only_its_own_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A --resume copy that failed (not interrupted) closed its partial file and
    # then removed the fixed name: a run starting in between made a new partial
    # file under that name, which the first run then removed under it.
    dir_fd = _dir_fd(tmp_path)
    try:
        a, b = (_run_file(dir_fd, "m.bin", 5, resume=True) for _ in range(2))
        _fill(a, b"first")
        real = os.unlink
        refused: list[OSError] = []

        def unlink_after_another_run_starts(*args: object, **kw: object) -> None:
            if not refused and str(args[0]).endswith("partial.tmp"):
                with pytest.raises(OSError, match="is in use") as info:
                    b.open()  # the partial file is still the failing run's
                refused.append(info.value)
            real(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "unlink", unlink_after_another_run_starts)
        a.abort(keep_for_resume=False)
        monkeypatch.undo()
        assert refused and os.listdir(tmp_path) == []
        _fill(b, b"other")  # once it is gone, the next run starts over
        b.publish()
        assert os.listdir(tmp_path) == ["m.bin"]
    finally:
        os.close(dir_fd)
