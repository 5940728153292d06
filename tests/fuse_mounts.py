"""The FUSE filesystem of tests/case_folding_fs.py mounted for one test, in a process of its
own; the test is skipped where it cannot be (no fusepy or libfuse 2, no /dev/fuse, not root)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def fuse_mount(tmp_path: Path, *options: str) -> Iterator[Path]:
    """``tmp_path/mnt``, over ``tmp_path/back``, for as long as the generator runs;
    ``options``: the helper's (``--refuse-dates``)."""
    if importlib.util.find_spec("fuse") is None or not os.path.exists("/dev/fuse") or (
            os.geteuid() != 0):
        pytest.skip("a FUSE mount for this test needs fusepy, /dev/fuse and root")
    back, mnt = tmp_path / "back", tmp_path / "mnt"
    back.mkdir()
    mnt.mkdir()
    helper = Path(__file__).resolve().parent / "case_folding_fs.py"
    proc = subprocess.Popen([sys.executable, str(helper), str(back), str(mnt), *options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not os.path.ismount(mnt) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not os.path.ismount(mnt):
        proc.kill()
        proc.wait()
        pytest.skip("the FUSE filesystem did not mount (libfuse 2 missing?)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
