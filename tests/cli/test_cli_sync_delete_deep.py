"""``sync --delete`` into a local directory whose paths run past PATH_MAX (4096 bytes):
the real CLI in a subprocess against local trees made a directory at a time."""

from __future__ import annotations

import os
from pathlib import Path

from cli_env import cli

#: 19 directories of 200 bytes: under PATH_MAX below a short root, past it below a long one.
LEVELS = [f"{i:02d}" + "d" * 198 for i in range(19)]


def _make(root: Path, files: dict[str, bytes], link: str = "") -> None:
    """``files`` (names) at the bottom of ``LEVELS`` under ``root``, by directory fds, and a
    symbolic link named ``link`` there (to ``/``) where given."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        for name in LEVELS:
            try:
                os.mkdir(name, dir_fd=fd)
            except FileExistsError:
                pass
            below = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = below
        for name, data in files.items():
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, dir_fd=fd)
            os.write(out, data)
            os.close(out)
        if link:
            os.symlink("/", link, dir_fd=fd)
    finally:
        os.close(fd)


def _names(root: Path) -> list[str]:
    fd = os.open(root, os.O_RDONLY)
    try:
        for name in LEVELS:
            below = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = below
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def test_sync_delete_reaches_a_file_past_path_max(tmp_path: Path) -> None:
    """A file at DST whose path is longer than PATH_MAX was never deleted (its directory
    was looked at by its whole path: 'File name too long'), though the copy wrote
    there; it is deleted now, its neighbour SRC holds kept, a file the rules leave out
    kept, a symbolic link there named (never deleted nor followed), and ``--dryrun`` only
    says so."""
    src, dst = tmp_path / "s", tmp_path / "d" / ("r" * 250) / ("q" * 200)
    _make(src, {"keep.bin": b"k"})
    (src / "top.bin").write_bytes(b"t")
    _make(dst, {"stale.bin": b"x", "keep.bin": b"old", "x.tmp": b"t"}, link="root-link")
    (dst / "stale-top.bin").write_bytes(b"x")
    assert len(os.fsencode(dst)) + sum(len(n) + 1 for n in LEVELS) > 4096
    r = cli("sync", "--delete", "--dryrun", "--exclude", "*.tmp", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    assert "stale.bin" in r.stdout and "stale-top.bin" in r.stdout, r.stdout
    assert _names(dst) == ["keep.bin", "root-link", "stale.bin", "x.tmp"]
    r = cli("sync", "--delete", "--exclude", "*.tmp", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    left = [line for line in r.stderr.splitlines() if "--delete left" in line]
    assert len(left) == 1 and left[0].endswith("/root-link alone: a symbolic link, which sync "
                                               "--delete never deletes (rm it if it should go)")
    assert _names(dst) == ["keep.bin", "root-link", "x.tmp"]
    assert not (dst / "stale-top.bin").exists() and (dst / "top.bin").read_bytes() == b"t"
