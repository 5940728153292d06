"""A copy's width follows its link (:mod:`tensorstream.copy.width`): wider on a
paced link, not on an unlimited one; and the permits it adds and takes back."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorstream.copy import width
from tensorstream.copy.engine import copy
from tensorstream.copy.width import Sample, Width, ready_share

MiB = 1 << 20
HAVE_NGINX = shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()


@pytest.fixture
def widths(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Width]]:
    """Every :class:`Width` a copy makes (to read how wide it went)."""
    made: list[Width] = []
    init = Width.__init__

    def spy(self: Width, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(Width, "__init__", spy)
    # The idle-machine rule is not what these tests are about: on a quiet
    # machine it would widen the unlimited copy too.
    monkeypatch.setattr(width, "link_bound", lambda before, now: False)
    yield made


def _objects(root: Path, count: int, size: int, prefix: str = "") -> list[str]:
    (root / "b").mkdir(parents=True)
    names = []
    for i in range(count):
        (root / "b" / f"{prefix}{i:02d}.bin").write_bytes(os.urandom(size + i))
        names.append(f"b/{prefix}{i:02d}.bin")
    return names


def _check(out: Path, root: Path, names: list[str]) -> None:
    for name in names:
        assert (out / Path(name).name).read_bytes() == (root / name).read_bytes()


def _copy_from_paced(tmp_path: Path, count: int, *, concurrency: int) -> None:
    """Copy ``count`` objects of 2 MiB from the benchmark's paced server (every
    connection capped at 8 MB/s by the kernel, a process of its own), checked
    byte for byte."""
    from benchmarks import servers

    root = tmp_path / "root"
    names = _objects(root, count, 2 * MiB)
    with servers.start_paced(root, 8_000_000) as srv:
        out = tmp_path / "out"
        # (no jobs given: objects widen with the parts; a number given is kept)
        result = copy([f"{srv.url}/{n}" for n in names], f"{out}/", concurrency=concurrency)
    assert result.ok and result.files == len(names), result.errors
    _check(out, root, names)


def test_a_paced_link_is_copied_wider(tmp_path: Path, widths: list[Width]) -> None:
    # Every connection capped at 8 MB/s by the kernel (the benchmark's paced
    # server, a process of its own): the bytes are never there before they
    # are asked for, so the copy goes wider than --concurrency. Without the
    # widening it stays at 2 (and takes 7 waves of ~0.27 s).
    _copy_from_paced(tmp_path, 14, concurrency=2)
    assert len(widths) == 1 and widths[0].most > 2


@pytest.mark.skipif(not HAVE_NGINX, reason="needs Debian's nginx")
def test_an_unlimited_link_is_not_copied_wider(tmp_path: Path, widths: list[Width]) -> None:
    # nginx on loopback: the bytes are there before the copy asks for them,
    # so it keeps --concurrency (at most one doubling, for a window in which
    # a loaded machine kept nginx from sending; never the cap of 4x).
    from benchmarks import servers

    root = tmp_path / "root"
    names = _objects(root, 40, 2 * MiB)
    with servers.start_nginx(root, tmp_path / "nginx") as srv:
        out = tmp_path / "out"
        result = copy([f"{srv.url}/{n}" for n in names], f"{out}/", concurrency=2)
    assert result.ok and result.files == len(names), result.errors
    _check(out, root, names)
    assert len(widths) == 1 and widths[0].most <= 4


@pytest.mark.skipif(not HAVE_NGINX, reason="needs Debian's nginx")
def test_a_link_that_speeds_up_is_followed(tmp_path: Path, widths: list[Width]) -> None:
    # The first objects come over the paced link (the copy widens), the rest
    # from nginx (the bytes are there before they are asked for): the width
    # comes back down. Without the narrowing it would end as wide as it went.
    from benchmarks import servers

    slow, fast = tmp_path / "slow", tmp_path / "fast"
    slow_names, fast_names = _objects(slow, 14, 2 * MiB), _objects(fast, 60, 2 * MiB, "f")
    with servers.start_paced(slow, 8_000_000) as paced, \
            servers.start_nginx(fast, tmp_path / "nginx") as nginx:
        out = tmp_path / "out"
        urls = [f"{paced.url}/{n}" for n in slow_names]
        urls += [f"{nginx.url}/{n}" for n in fast_names]
        result = copy(urls, f"{out}/", concurrency=2)
    assert result.ok and result.files == len(urls), result.errors
    _check(out, slow, slow_names)
    _check(out, fast, fast_names)
    assert len(widths) == 1 and widths[0].most > 2
    assert widths[0].width < widths[0].most


def test_ready_share() -> None:
    before = Sample(0.0, 0, 0, None)
    assert ready_share(before, Sample(0.05, 4 * MiB, MiB, None)) == 0.25
    assert ready_share(before, Sample(0.05, MiB - 1, 0, None)) is None  # too little to tell


def test_width_adds_and_takes_back_permits() -> None:
    async def main() -> None:
        jobs, reads = asyncio.Semaphore(2), asyncio.Semaphore(2)
        w = Width([jobs, reads], 2, widest=4)
        assert w.cap == 8
        for _ in range(2):
            await jobs.acquire()
            await reads.acquire()
        assert w.full()
        assert w.widen() == 2 and w.width == 4 and not w.full()
        assert w.widen() == 4 and w.widen() == 0 and w.width == 8 == w.most
        assert w.narrow() == 3 and w.width == 5
        await asyncio.sleep(0)
        assert jobs._value == reads._value == 3  # free permits taken back at once
        for _ in range(3):
            await jobs.acquire()
            await reads.acquire()
        assert w.narrow() == 2 and w.width == 3  # waits for permits in use ...
        await asyncio.sleep(0)
        assert jobs.locked() and reads.locked()
        assert w.widen() == 3 and w.width == 6  # ... and widening first calls those off
        await asyncio.sleep(0)
        assert jobs._value == reads._value == 1
        await w.close()
        for _ in range(5):  # the copy's own permits, handed back: none was lost
            jobs.release()
            reads.release()
        assert jobs._value == reads._value == 6

    asyncio.run(main())


def test_a_paced_link_widens_from_a_narrow_start(tmp_path: Path, widths: list[Width]) -> None:
    # --concurrency above START: the parts start START wide and the first
    # widening gives the rest of --concurrency at once. Without it the copy
    # would stay START wide on a link that is the limit.
    _copy_from_paced(tmp_path, 24, concurrency=16)
    assert len(widths) == 1 and widths[0].most >= 16


def test_a_narrow_start_gives_the_parts_slot_the_rest_of_base() -> None:
    async def main() -> None:
        jobs, reads = asyncio.Semaphore(16), asyncio.Semaphore(width.START)
        w = Width([jobs, reads], 16, widest=2, start=(reads, width.START))
        assert w.width == width.START == w.most
        assert w.narrow() == 0 and w.width == width.START  # never below the start
        assert w.widen() == 16 - width.START and w.width == 16 == w.most
        assert jobs._value == 16 and reads._value == 16  # only the parts' slot was short
        assert w.widen() == 16 and w.width == 32 == w.cap
        assert jobs._value == reads._value == 32
        await w.close()

    asyncio.run(main())


def test_the_width_stays_within_the_open_file_limit() -> None:
    w = Width([asyncio.Semaphore(8)], 8, widest=4, most=20)
    assert w.cap == 20  # not 32: each part in flight holds descriptors
    assert Width([asyncio.Semaphore(8)], 8, widest=4, most=3).cap == 8  # never below base
    assert Width([asyncio.Semaphore(8)], 8, widest=4).cap == 32


def test_descriptor_room_is_what_the_soft_limit_leaves() -> None:
    import subprocess
    import sys

    # In a child (the limit is the process's): under ulimit -n 256, with what is open now.
    code = """
import resource, os
from tensorstream.copy.width import FDS_PER_PART, descriptor_room
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
room = descriptor_room()
assert room is not None and 1 <= room <= (256 - len(os.listdir("/proc/self/fd"))) // FDS_PER_PART
assert room * FDS_PER_PART >= 256 - 100, room
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(250 - len(os.listdir("/proc/self/fd")))]
assert descriptor_room() == 1  # nothing left: one at a time, never none
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
