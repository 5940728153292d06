"""``sync --delete`` into a local directory whose paths run past PATH_MAX (4096 bytes):
the real CLI in a subprocess against local trees made a directory at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


def _bottom(root: Path) -> int:
    """A descriptor of the bottom of ``LEVELS`` under ``root``, opened a directory at a time."""
    fd = os.open(root, os.O_RDONLY)
    for name in LEVELS:
        try:
            below = os.open(name, os.O_RDONLY, dir_fd=fd)
        finally:
            os.close(fd)
        fd = below
    return fd


def _names(root: Path) -> list[str]:
    fd = _bottom(root)
    try:
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


def test_a_directory_past_path_max_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    """A directory below PATH_MAX's reach that the deep listing could not read was skipped
    without a word (the shallow listing names one): what is under it was never looked at,
    and the run said nothing of it. Run without root's right to read any directory
    (``setpriv`` drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), as any other user is."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop root's right to read any directory")
    src, dst = tmp_path / "s", tmp_path / "d" / ("r" * 250) / ("q" * 200)
    _make(src, {"keep.bin": b"k"})
    _make(dst, {"keep.bin": b"k"})
    fd = _bottom(dst)
    try:
        os.mkdir("closed", dir_fd=fd)
        inner = os.open("closed", os.O_RDONLY, dir_fd=fd)
        os.close(os.open("stale.bin", os.O_WRONLY | os.O_CREAT, dir_fd=inner))
        os.close(inner)
        os.chmod("closed", 0, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        r = subprocess.run(
            ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
             "tensorstream", "sync", "--delete", str(src), str(dst)],
            capture_output=True, text=True, timeout=120)
    finally:
        _chmod_closed(dst)
    assert r.returncode == 0, r.stderr
    left = [line for line in r.stderr.splitlines() if "--delete left" in line]
    assert len(left) == 1, r.stderr
    assert left[0].endswith("/closed alone: cannot read directory (Permission denied); "
                            "nothing under it was looked at"), left[0]


def _chmod_closed(root: Path) -> None:
    fd = _bottom(root)
    try:
        os.chmod("closed", 0o755, dir_fd=fd)
    finally:
        os.close(fd)
