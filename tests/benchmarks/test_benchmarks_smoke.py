"""Smoke test of the benchmark harness: it runs end to end and verifies what it measures.

Nothing here is about speed: only that ``python -m benchmarks.run --quick``
starts and stops its servers, runs tensorstream and its peers in fresh
processes, and reports verified rows (and skipped ones with a reason).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `benchmarks` lives at the repo root, not in src/
    sys.path.insert(0, str(REPO))

from benchmarks.run import parse_size  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="needs Debian's nginx"
    ),
]


def test_parse_size_units() -> None:
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("25m") == 25_000_000


@pytest.mark.timeout(400)
def test_quick_run_reports_verified_rows(tmp_path: Path) -> None:
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--quick",
            "--size",
            "32MiB",
            "--backend",
            "local,http",
            "--scenario",
            "load,raw",
            "--cache",
            str(tmp_path / "cache"),
            "--json",
            str(out),
            "--markdown",
            str(md),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    keys = {
        "scenario",
        "backend",
        "profile",
        "contender",
        "seconds_median",
        "seconds_min",
        "seconds_max",
        "gbps_median",
        "peak_rss_mib",
        "verified",
    }
    assert all(keys <= set(r) for r in rows)
    ran = [r for r in rows if r["status"] != "skipped"]
    assert {(r["scenario"], r["backend"]) for r in ran} >= {
        ("load", "local"),
        ("load", "http"),
        ("raw", "local"),
        ("raw", "http"),
    }
    # every measured row is verified against the generator's checksums
    assert ran and all(r["verified"] for r in ran), [r for r in ran if not r["verified"]]
    assert all(r["seconds_min"] <= r["seconds_median"] <= r["seconds_max"] for r in ran)
    # the peers ran too, not just tensorstream
    assert any(r["contender"].startswith("tensorizer") for r in ran)
    # a skipped contender carries its reason
    assert all(r["note"] for r in rows if r["status"] == "skipped")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| contender |" in md.read_text()
    assert data["header"]["machine"]["cpus"] >= 1


def test_servers_stop_and_paced_server_caps_one_connection(tmp_path: Path) -> None:
    from benchmarks import servers

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "obj").write_bytes(bytes(range(256)) * (8 << 12))  # 8 MiB
    with servers.start_paced(tmp_path, 20_000_000) as paced:
        rate = servers.measure_one_connection(f"{paced.url}/b/obj", 4 << 20)
        proc = paced.proc
    assert proc.poll() is not None  # stopped on exit
    assert 10e6 < rate < 30e6  # the kernel paces the connection near 20 MB/s


def test_rounds_alternate_and_rotate_the_first_contender_of_each_group() -> None:
    from benchmarks.contenders import Contender
    from benchmarks.run import round_order

    plan = [Contender("load", "http", n, [], "", "worker") for n in "ABC"] + [
        Contender("load", "s3", n, [], "", "worker") for n in "XY"]
    names = [[plan[i].name for i in round_order(plan, r)] for r in range(3)]
    assert names == [list("ABCXY"), list("BCAYX"), list("CABXY")]
