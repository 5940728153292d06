"""Folders of thousands of objects: ``cp -r``, ``sync`` and ``ls -r`` of 5,000
small objects, local and on moto's S3 (5 listing pages of 1,000 keys), each
CLI run in a child limited to 256 open files, its peak RSS recorded: open
files and memory stay bounded, every object arrives whole, a second sync
copies nothing, and the output is one summary, not a line per object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_env import s3_env
from fixtures_s3 import S3_BUCKET

pytestmark = pytest.mark.slow

COUNT = 5000
MiB = 1 << 20
# VmHWM (KiB), not ru_maxrss: that keeps the forking parent's RSS across fork and exec
# (a whole test run's pytest is hundreds of MiB).
_CHILD = """
import atexit, resource, runpy, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
atexit.register(lambda: print("MAXRSS", hwm(), file=sys.stderr))
sys.argv = ["tensorstream", *sys.argv[1:]]
runpy.run_module("tensorstream", run_name="__main__", alter_sys=True)
"""


def _name(i: int) -> str:
    return f"d{i // 1000}/f{i:04d}.bin"


def _data(i: int) -> bytes:
    return f"object {i}\n".encode() * (1 + i % 7)


def _run(env: dict[str, str] | None, *argv: str) -> tuple[str, str]:
    r = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rss = [int(line.split()[1]) for line in r.stderr.splitlines() if line.startswith("MAXRSS")]
    assert rss and rss[0] << 10 < 300 * MiB, f"{argv[0]}: peak RSS {rss[0] >> 10} MiB"
    # One summary, not a line per object (a progress line per object would be >= COUNT).
    assert len(r.stderr.splitlines()) < 50, r.stderr[-3000:]
    return r.stdout, r.stderr


def _check(root: Path) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    assert len(files) == COUNT
    for i in (0, 1, 999, 1000, 2500, COUNT - 1):
        assert (root / _name(i)).read_bytes() == _data(i)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for i in range(COUNT):
        path = root / _name(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_data(i))
    return root


def test_five_thousand_objects_local_and_s3(src: Path, tmp_path: Path, moto_s3: Any) -> None:
    env = s3_env(moto_s3, tmp_path)
    s3 = ["--endpoint-url", moto_s3.endpoint_url]
    prefix = f"s3://{S3_BUCKET}/many/"

    out, _ = _run(env, "cp", "-r", "--json", *s3, f"{src}/", prefix)
    summary = json.loads(out.splitlines()[-1])
    assert summary["files"] == COUNT and summary["errors"] == [], summary

    out, _ = _run(env, "ls", "-r", *s3, prefix)
    assert out.splitlines() == sorted(_name(i) for i in range(COUNT))

    local = tmp_path / "synced"
    out, _ = _run(env, "sync", "--json", *s3, prefix, f"{local}/")
    assert json.loads(out.splitlines()[-1])["files"] == COUNT
    _check(local)
    out, _ = _run(env, "sync", "--json", *s3, prefix, f"{local}/")  # nothing changed
    assert json.loads(out.splitlines()[-1])["files"] == 0

    copied = tmp_path / "copied"
    out, _ = _run(env, "cp", "-r", "--json", f"{src}/", f"{copied}/")
    assert json.loads(out.splitlines()[-1])["files"] == COUNT
    _check(copied)
    out, _ = _run(env, "ls", "-r", f"{copied}/")
    assert len(out.splitlines()) == COUNT
