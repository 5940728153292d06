"""A copy into itself judged on overlayfs (a container's root, Docker's layers): the check
compares directories by device and inode (:func:`tensorstream.copy.places.inside`), and on
an overlay whose layers are on other filesystems a file's ``st_dev`` is not its directory's
(files report their layer's, directories the overlay's). Directories alone are compared,
and the overlay gives each its own inode number there, so a copy beside SRC runs and one
into SRC through a bind mount is still refused. Run in a mount namespace of its own
(``unshare -rm``: layers on two tmpfs, the overlay, a bind mount); nothing outside sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mount_namespace import can_bind_mount

#: In the namespace: the lower layer holds ``src`` (files at two levels) and ``both`` (a
#: directory the upper layer writes into: merged, copied up); then each copy's result and,
#: first, what the overlay reports: the (st_dev, st_ino) of every directory and of a file.
_OVERLAY = """\
import json, os, subprocess, sys
from tensorstream.copy.engine import copy_tree
from tensorstream.copy.select import Rules
top = sys.argv[1]
lower, upper, merged, view = (os.path.join(top, n) for n in ("lower", "upper", "m", "view"))
for d in (lower, upper, merged, view):
    os.mkdir(d)
for d in (lower, upper):
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True)
for d in ("src/d", "both"):
    os.makedirs(os.path.join(lower, d))
for name in ("src/a.bin", "src/d/c.txt", "both/x"):
    with open(os.path.join(lower, name), "wb") as f:
        f.write(name.encode())
os.makedirs(os.path.join(upper, "u"))
os.makedirs(os.path.join(upper, "w"))
subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={lower},upperdir={upper}/u,workdir={upper}/w", merged], check=True)
src = os.path.join(merged, "src")
for i in range(12):  # directories made in the upper layer, beside src
    os.makedirs(os.path.join(merged, "dst", *(f"n{j}" for j in range(i + 1))), exist_ok=True)
dirs = {}
for here, names, _ in os.walk(merged):
    st = os.stat(here)
    dirs[os.path.relpath(here, merged)] = [st.st_dev, st.st_ino]
file_dev = os.stat(os.path.join(src, "a.bin")).st_dev
print(json.dumps([dirs, file_dev]))
deepest = os.path.join(merged, "dst", *(f"n{j}" for j in range(12)))
subprocess.run(["mount", "--bind", src, view], check=True)
for dest, rules in ((os.path.join(merged, "dst", "bk"), []), (os.path.join(deepest, "bk"), []),
                    (os.path.join(merged, "both", "bk"), []), (os.path.join(view, "bk"), []),
                    (os.path.join(view, "bk"), [("exclude", "bk/*")]),
                    (os.path.join(src, "bk"), [])):
    result = copy_tree(src, dest, include=Rules(rules))
    print(json.dumps([result.ok, result.errors]))
"""


def _can_mount_overlay(tmp_path: Path) -> bool:
    """Whether ``unshare -rm`` may mount tmpfs and an overlay here (kernels from 5.11 let a
    user namespace mount overlayfs; a container may forbid it)."""
    top = tmp_path / "probe"
    for d in ("l", "u", "w", "m"):
        (top / d).mkdir(parents=True)
    script = (f"mount -t tmpfs tmpfs {top}/l && mount -t overlay overlay -o "
              f"lowerdir={top}/l,upperdir={top}/u,workdir={top}/w {top}/m")
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                              timeout=30, check=False).returncode == 0
    except OSError:
        return False


def test_copies_on_an_overlay_are_judged_by_directories_alone(tmp_path: Path) -> None:
    """On an overlay over layers on other filesystems: copies beside SRC (into new
    directories of the upper layer, into a merged directory copied up) run, not refused as a
    copy into itself; one into SRC through a bind mount of it (the case the check is for) is
    refused, with its ``--exclude 'bk/*'`` way out; one into SRC by its own path too."""
    if not can_bind_mount(tmp_path) or not _can_mount_overlay(tmp_path):
        pytest.skip("no overlay in a mount namespace of one's own here (unshare -rm)")
    (tmp_path / "ns").mkdir()
    proc = subprocess.run(["unshare", "-rm", sys.executable, "-c", _OVERLAY,
                           str(tmp_path / "ns")], capture_output=True, text=True, timeout=180,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    first, *results = (json.loads(line) for line in proc.stdout.splitlines())
    dirs, file_dev = first
    # What makes an overlay a case of its own: a file's device is not its directory's...
    assert file_dev != dirs["src"][0], first
    # ...and yet no two directories share a device and inode (what the check compares).
    assert len({tuple(v) for v in dirs.values()}) == len(dirs), dirs
    beside, deep, copied_up, through_view, left_out, by_path = results
    assert beside == [True, []] and deep == [True, []] and copied_up == [True, []], results
    assert not through_view[0] and len(through_view[1]) == 1, through_view
    assert "cannot copy a directory into itself" in through_view[1][0], through_view
    assert "--exclude 'bk/*'" in through_view[1][0]
    assert left_out == [True, []]
    assert not by_path[0] and "into itself" in by_path[1][0], by_path
