"""``sync --delete`` where DST holds SRC by a bind mount (``/data`` mounted again at
``/view``, as a container's volume is): no realpath tells, so ``--delete`` took SRC's own
files under DST for extraneous and deleted the source itself. Each command runs in a mount
namespace of its own (:mod:`mount_namespace`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mount_namespace import can_bind_mount


def _files(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*"))
            if p.is_file()}


def _bound_cli(data: Path, view: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``tensorstream ARGV`` with ``data`` bound at ``view``."""
    script = ("import subprocess, sys\n"
              "subprocess.run(['mount', '--bind', sys.argv[1], sys.argv[2]], check=True)\n"
              "from tensorstream.cli.main import main\n"
              "sys.exit(main(sys.argv[3:]))\n")
    return subprocess.run(["unshare", "-rm", sys.executable, "-c", script, str(data), str(view),
                           *argv], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    if not can_bind_mount(tmp_path):
        pytest.skip("no mount namespace of one's own here (unshare -rm)")
    top = tmp_path / "data"
    (top / "src").mkdir(parents=True)
    (top / "src" / "a.txt").write_bytes(b"a")
    (top / "other.txt").write_bytes(b"o")
    (tmp_path / "view").mkdir()
    return top


def test_sync_delete_into_a_bind_mount_holding_the_source_is_refused(data: Path) -> None:
    view = data.parent / "view"
    for src, dst in ((data / "src", f"{view}/"), (data / "src", f"{view}/src"),
                     (view / "src", f"{data}/")):
        for dryrun in ([], ["--dryrun"]):
            r = _bound_cli(data, view, "sync", "--delete", *dryrun, str(src), str(dst))
            assert r.returncode == 2, r.stdout + r.stderr
            # (SRC itself by the bind: the same place, refused as such)
            said = "same place" if dst == f"{view}/src" else "it would delete the source itself"
            assert said in r.stderr and r.stdout == "", r.stderr
    assert _files(data) == {"other.txt": b"o", "src/a.txt": b"a"}


def test_sync_delete_into_a_bind_mount_beside_the_source_runs(data: Path) -> None:
    # The neighbour: DST is bound elsewhere (not holding SRC): its own extra file goes.
    view = data.parent / "view"
    out = data.parent / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "stale.txt").write_bytes(b"s")
    r = _bound_cli(out, view, "sync", "--delete", str(data / "src"), f"{view}/sub/")
    assert r.returncode == 0, r.stderr
    assert _files(out) == {"sub/a.txt": b"a"}
    assert _files(data) == {"other.txt": b"o", "src/a.txt": b"a"}


@pytest.mark.parametrize("bound", ["src", "data"])
def test_sync_delete_into_a_dst_holding_the_source_by_a_mount_below_it_is_refused(
        data: Path, bound: str) -> None:
    """SRC (or a directory above it) bound at a directory below DST (``/data/src`` at
    ``/view/a sub``; ``sync --delete /data/src /view/``): neither path is under the other,
    and the walk up from SRC never meets DST, so ``--delete`` took ``a sub/a.txt`` for an
    extraneous file of DST and deleted the source itself. Now refused, as a bind of DST
    itself is."""
    view = data.parent / "view"
    (view / "a sub").mkdir()  # (mountinfo writes its space as \040)
    what = data / "src" if bound == "src" else data
    for dryrun in ([], ["--dryrun"]):
        r = _bound_cli(what, view / "a sub", "sync", "--delete", *dryrun, str(data / "src"),
                       f"{view}/")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "it would delete the source itself" in r.stderr and r.stdout == ""
    assert _files(data) == {"other.txt": b"o", "src/a.txt": b"a"}
    assert _files(view) == {}


def test_sync_delete_into_a_dst_with_another_mount_below_it_runs(data: Path) -> None:
    # The neighbour: a mount below DST holding something else: its stale file goes.
    view, out = data.parent / "view", data.parent / "out"
    (view / "sub").mkdir()
    out.mkdir()
    (out / "stale.txt").write_bytes(b"s")
    r = _bound_cli(out, view / "sub", "sync", "--delete", str(data / "src"), f"{view}/")
    assert r.returncode == 0, r.stderr
    assert "delete: " in r.stdout and _files(out) == {}
    assert _files(data) == {"other.txt": b"o", "src/a.txt": b"a"}


def test_cp_r_into_a_dst_mounted_below_the_source_is_refused(data: Path) -> None:
    """DST bound at a directory below SRC (``/out`` mounted again at ``/data/src/mnt``;
    ``cp -r /data/src /out``): SRC's listing holds DST's files, so each run copied the
    last run's copies a level deeper (``mnt/mnt/a.txt``...). Refused as a copy into
    itself, with the --exclude that leaves DST out; that --exclude copies."""
    out = data.parent / "out"
    out.mkdir()
    (data / "src" / "mnt").mkdir()
    for argv in (["cp", "-r"], ["sync"]):
        r = _bound_cli(out, data / "src" / "mnt", *argv, str(data / "src"), str(out))
        assert r.returncode == 1 and "into itself" in r.stderr, r.stdout + r.stderr
        assert "--exclude 'mnt/*'" in r.stderr, r.stderr
    assert _files(out) == {}
    r = _bound_cli(out, data / "src" / "mnt", "cp", "-r", "--exclude", "mnt/*",
                   str(data / "src"), str(out))
    assert r.returncode == 0, r.stderr
    assert _files(out) == {"a.txt": b"a"}


@pytest.mark.parametrize("name", ["a\tb", "a\nb", "a\\134b", "a - b", "a\\b", "mnt (deleted)",
                                  "x\\040y"])
def test_a_mount_point_whose_name_mountinfo_escapes_is_still_found(
        data: Path, name: str) -> None:
    """mountinfo writes a space, tab, newline and backslash of a mount point as ``\\ooo``
    (``a\\134b`` is ``a\\b``, a literal ``\\134`` is ``\\134134``) and separates its
    optional fields with `` - ``: each such name below SRC (DST bound there) or below DST
    (SRC bound there) is still found, and the copy refused as with a plain name."""
    out, view = data.parent / "out", data.parent / "view"
    out.mkdir()
    (data / "src" / name).mkdir()
    r = _bound_cli(out, data / "src" / name, "cp", "-r", str(data / "src"), str(out))
    assert r.returncode == 1 and "into itself" in r.stderr, r.stdout + r.stderr
    assert _files(out) == {}
    (view / name).mkdir()
    r = _bound_cli(data / "src", view / name, "sync", "--delete", str(data / "src"),
                   f"{view}/")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "it would delete the source itself" in r.stderr
    assert _files(data) == {"other.txt": b"o", "src/a.txt": b"a"}
