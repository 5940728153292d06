"""The folder cells' reference row (``benchmarks/minimal_copy.py``) copies
exactly what the server holds, against the harness's own static server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks import servers

REPO = Path(__file__).resolve().parents[2]


def _run(url: str, prefix: str, dest: Path, threads: int = 3) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.minimal_copy", url, "bench", prefix, str(dest),
         str(threads)],
        cwd=REPO, capture_output=True, text=True, timeout=60)


def test_every_object_is_copied_byte_for_byte(tmp_path: Path) -> None:
    # Sizes around the O_DIRECT alignment and the 1 MiB buffer: empty, unaligned,
    # one page, a buffer and a byte, several buffers; one object one level down.
    sizes = {"a.bin": 0, "b.bin": 5000, "c.bin": 4096, "d.bin": (1 << 20) + 1,
             "e.bin": 3 << 20, "sub/f.bin": 123_457}
    root = tmp_path / "root"
    for name, size in sizes.items():
        path = root / "bench" / "dir" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    dest = tmp_path / "out"
    with servers.start_static(root) as srv:
        proc = _run(srv.url, "dir/", dest)
    assert proc.returncode == 0, proc.stderr
    for name in sizes:
        assert (dest / name).read_bytes() == (root / "bench" / "dir" / name).read_bytes()
    assert not [p for p in dest.rglob(".*.tmp")]


def test_an_empty_prefix_copies_nothing(tmp_path: Path) -> None:
    (tmp_path / "root" / "bench").mkdir(parents=True)
    with servers.start_static(tmp_path / "root") as srv:
        proc = _run(srv.url, "nothing/", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "out").iterdir()) == []
