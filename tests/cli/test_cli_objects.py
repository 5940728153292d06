"""``tensorstream stat | cat | rm`` (cli/objects.py) as operators script them: refusals,
ranges, ``--json`` for every outcome; the real CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def cli(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120, **kw)


def test_rm_r_of_the_root_directory_is_refused() -> None:
    # GNU rm's --preserve-root: every file on the machine is never what was meant.
    for target in ("/", "file:///", "//", "/tmp/..", "/."):
        r = cli("rm", "-r", "--dryrun", target)
        assert r.returncode == 2, (target, r.stderr[-300:])
        assert r.stdout == "" and "refusing" in r.stderr and "Traceback" not in r.stderr


def test_cat_range_that_is_empty_or_backwards_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "ten.bin"
    f.write_bytes(b"0123456789")
    for bad in ("3-2", "-0"):  # no bytes at all: HTTP answers 416, not an empty 206
        r = cli("cat", "--range", bad, str(f))
        assert r.returncode == 2 and r.stdout == "", (bad, r.stderr)
        assert "--range" in r.stderr
    for good, want in (("3-3", "3"), ("0-0", "0"), ("9-", "9"), ("-10", "0123456789"),
                       ("-99", "0123456789"), ("8-99", "89")):
        r = cli("cat", "--range", good, str(f))
        assert (r.returncode, r.stdout) == (0, want), (good, r.stderr)


def test_rm_json_reports_a_failed_delete_of_one_object(tmp_path: Path) -> None:
    # As rm -r --json does for each object that fails: one line saying so, on stdout.
    r = cli("rm", "--json", str(tmp_path / "missing.bin"))
    assert r.returncode == 1 and "no such file" in r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 1 and lines[0]["op"] == "delete" and lines[0]["status"] == "failed"
    assert lines[0]["uri"] == str(tmp_path / "missing.bin") and "no such file" in lines[0]["error"]
    (tmp_path / "there.bin").write_bytes(b"x")
    r = cli("rm", "--json", str(tmp_path / "there.bin"))
    assert r.returncode == 0 and [json.loads(line) for line in r.stdout.splitlines()] == [
        {"op": "delete", "status": "deleted", "uri": str(tmp_path / "there.bin")}]
