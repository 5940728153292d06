"""How a copy into a local directory shares its reads: a failed object does not starve the
others, memory is bounded by the buffer pool, a one-part object hands its read slot back
before the disk, and a copy waiting on its link goes wider (never past ``concurrency``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flaky_providers import PART, FlakyProvider, SlowProvider, names_in

from tensorstream.copy.engine import copy


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
    assert result.files == 2 and names_in(dst) == ["f.bin", "g.bin"]
    for n in good:
        assert (dst / f"{n}.bin").read_bytes() == flaky.store[f"b/{n}.bin"]


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
