"""A Redis root holding a damaged object beside good ones (a tensorizer ``to_redis``
prefix with a gap, a tensorstream manifest with impossible numbers): ``cp -r`` and
``sync`` copy the rest, fail the damaged objects they select by name, and never look
at one the rules leave out; ``sync --delete`` keeps a damaged object's copy."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DB = 13  # a database of this file's own


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def root(redis_server: Any) -> Iterator[str]:
    with redis_server.client(db=DB) as c:
        c.flushdb()
        c.set("good1", b"one")
        c.set("dir/good2", b"two")
        c.set("tz:header:0", b"h" * 10)  # a to_redis prefix whose bytes 10-499 are missing
        c.set("tz:data:500", b"d" * 10)
        c.hset("man", mapping={"tensorstream": "1", "size": "-5", "chunk_size": "1000",
                               "generation": "0123456789abcdef"})
    yield redis_server.url("", db=DB)
    with redis_server.client(db=DB) as c:
        c.flushdb()


def _files(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in top.rglob("*") if p.is_file()}


@pytest.mark.parametrize("cmd", [["cp", "-r"], ["sync"]])
def test_damaged_objects_left_out_are_never_looked_at(root: str, tmp_path: Path,
                                                      cmd: list[str]) -> None:
    # It failed whole: "tensorstream: error: ... not one contiguous stream", --exclude or not.
    out = tmp_path / "out"
    r = cli(*cmd, "--exclude", "tz*", "--exclude", "man", root, f"{out}/")
    assert r.returncode == 0, r.stderr
    assert _files(out) == {"good1": b"one", "dir/good2": b"two"}


@pytest.mark.parametrize("cmd", [["cp", "-r"], ["sync"]])
def test_damaged_objects_selected_fail_by_name_and_the_rest_is_copied(
        root: str, tmp_path: Path, cmd: list[str]) -> None:
    out = tmp_path / "out"
    r = cli(*cmd, root, f"{out}/")
    assert r.returncode == 3, r.stderr  # partial: some copied, some failed
    assert _files(out) == {"good1": b"one", "dir/good2": b"two"}
    errors = [line for line in r.stderr.splitlines() if "error" in line or "failed" in line]
    assert any("tz" in line and "contiguous" in line for line in errors), r.stderr
    assert any("'man'" in line and "corrupt" in line for line in errors), r.stderr


def test_sync_delete_keeps_the_copy_of_a_damaged_object(root: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "tz").write_bytes(b"an earlier copy")
    (out / "stale").write_bytes(b"gone from the source")
    r = cli("sync", "--delete", "--exclude", "tz*", "--exclude", "man", root, f"{out}/")
    assert r.returncode == 0, r.stderr
    # (excluded keys are not deleted at DST either; 'stale' is not under SRC)
    assert _files(out) == {"good1": b"one", "dir/good2": b"two", "tz": b"an earlier copy"}
    (out / "stale").write_bytes(b"gone from the source")
    r = cli("sync", "--delete", root, f"{out}/")
    assert r.returncode == 3, r.stderr
    assert (out / "tz").read_bytes() == b"an earlier copy" and (out / "stale").exists()


def test_ls_shows_the_rest_and_names_each_damaged_object(root: str) -> None:
    r = cli("ls", "-r", root)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[-1] for line in r.stdout.splitlines()) == ["dir/good2", "good1"]
    assert "'tz'" in r.stderr and "'man'" in r.stderr, r.stderr


def test_rm_r_leaves_out_what_the_rules_leave_out_and_fails_the_rest_by_name(
        root: str, redis_server: Any) -> None:
    # It failed whole as cp -r did: nothing deleted, --exclude or not.
    r = cli("rm", "-r", "--exclude", "tz*", "--exclude", "man", "--exclude", "dir/*", root)
    assert r.returncode == 0, r.stderr
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys()) == [b"dir/good2", b"man", b"tz:data:500", b"tz:header:0"]
    r = cli("rm", "-r", root)
    assert r.returncode == 3, r.stderr  # dir/good2 deleted, the damaged two named
    assert "'man'" in r.stderr and "'tz'" in r.stderr, r.stderr
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys()) == [b"man", b"tz:data:500", b"tz:header:0"]
