"""``tensorstream ls`` (cli/ls.py) of large trees: what it reads before the first line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_ls_of_a_directory_without_r_reads_only_that_directory(tmp_path: Path) -> None:
    # It walked the whole tree below before printing a line: `ls /` (every file of
    # the machine) never answered, and a link to / inside any folder did the same.
    d = tmp_path / "d"
    (d / "sub" / "deeper").mkdir(parents=True)
    (d / "sub" / "deeper" / "w.bin").write_bytes(b"x")
    (d / "empty").mkdir()
    (d / "a.bin").write_bytes(b"0123456789")
    (d / "link.bin").symlink_to(d / "a.bin")  # a link is listed as cp -r copies it
    (d / "broken.bin").symlink_to(d / "gone")
    (d / "all").symlink_to("/")
    (d / ".x.bin.tensorstream-partial.tmp").write_bytes(b"")  # our own temp file
    os.mkfifo(d / "fifo")
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", "-l", str(d)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[-1] for line in lines] == [
        "a.bin", "all/", "empty/", "link.bin", "sub/"]
    assert lines[0].split()[-2:] == ["10", "a.bin"] and lines[3].split()[-2:] == ["10", "link.bin"]
    assert lines[1].split() == ["PRE", "all/"]
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", "--json", str(d / "sub")],
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, '{"prefix": "deeper/"}\n'), r.stderr
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", str(d / "empty")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no objects at" in r.stderr
