"""Smoke test of the benchmark harness: it runs end to end and verifies what it measures.

Nothing here is about speed: only that the links shape traffic the way the
matrix says (paced, token bucket, time to first byte; HTTP and path-style S3
including listings), and that ``python -m benchmarks.run`` starts and stops its
servers, runs tensorstream and its peers in fresh processes, and reports
verified rows (and skipped ones with a reason).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `benchmarks` lives at the repo root, not in src/
    sys.path.insert(0, str(REPO))

from benchmarks.run import parse_size  # noqa: E402

HAVE_NGINX = shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()
pytestmark = [pytest.mark.slow]


def test_parse_size_units() -> None:
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("25m") == 25_000_000


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, Any, bytes]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, resp.headers, resp.read()  # case-insensitive headers


@pytest.mark.timeout(60)
@pytest.mark.parametrize("link", ["loopback", "paced", "bucket", "ttfb"])
def test_links_answer_http_and_path_style_s3(tmp_path: Path, link: str) -> None:
    if link == "loopback" and not HAVE_NGINX:
        pytest.skip("needs Debian's nginx")
    from benchmarks import servers

    data = bytes(range(256)) * (4 << 10)  # 1 MiB
    (tmp_path / "root" / "b" / "dir").mkdir(parents=True)
    (tmp_path / "root" / "b" / "obj").write_bytes(data)
    (tmp_path / "root" / "b" / "dir" / "x.bin").write_bytes(b"x" * 10)
    with servers.start_link(link, tmp_path / "root", tmp_path, rate=20_000_000, burst=1 << 20) as srv:
        status, headers, _ = _get(f"{srv.url}/b/obj", method="HEAD")
        assert status == 200 and int(headers["Content-Length"]) == len(data) and headers["ETag"]
        # a presigned-looking query is ignored, as the S3 stand-in must
        status, headers, body = _get(f"{srv.url}/b/obj?X-Amz-Signature=abc", {"Range": "bytes=100-199"})
        assert status == 206 and body == data[100:200]
        assert headers["Content-Range"] == f"bytes 100-199/{len(data)}"
        status, _, body = _get(f"{srv.url}/b/obj", {"Range": "bytes=-10"})
        assert status == 206 and body == data[-10:]
        _, _, xml = _get(f"{srv.url}/b?list-type=2&prefix=dir/")
        assert b"<Key>dir/x.bin</Key>" in xml and b"<Key>obj</Key>" not in xml
        assert headers["ETag"].encode() in _get(f"{srv.url}/b?list-type=2&prefix=o")[2].replace(
            b"&quot;", b'"'
        )
        procs = [s.proc for s in srv.servers]
    assert all(p.poll() is not None for p in procs)  # stopped on exit


@pytest.mark.timeout(60)
def test_bucket_bursts_then_paces_and_ttfb_delays(tmp_path: Path) -> None:
    from benchmarks import servers

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "obj").write_bytes(b"\0" * (12 << 20))
    with servers.start_link("bucket", tmp_path, tmp_path, rate=20_000_000, burst=4 << 20) as srv:
        burst = servers.measure_one_connection(f"{srv.url}/b/obj", 3 << 20)  # inside the burst
        whole = servers.measure_one_connection(f"{srv.url}/b/obj", 12 << 20)  # 4 MiB burst + 8 MiB paced
    assert burst > 60e6
    assert 20e6 < whole < 35e6  # 12 MiB in ~0.42 s: 4 MiB at once, then 20 MB/s
    with servers.start_link("ttfb", tmp_path, tmp_path, ttfb=(0.03, 0.04)) as srv:
        start = time.perf_counter()
        _get(f"{srv.url}/b/obj", {"Range": "bytes=0-0"})
        assert time.perf_counter() - start >= 0.03
    with servers.start_paced(tmp_path, 20_000_000) as paced:
        rate = servers.measure_one_connection(f"{paced.url}/b/obj", 4 << 20)
    assert 10e6 < rate < 30e6  # the kernel paces the connection near 20 MB/s


@pytest.mark.skipif(not HAVE_NGINX, reason="needs Debian's nginx")
@pytest.mark.timeout(120)
def test_matrix_run_reports_verified_rows(tmp_path: Path) -> None:
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--quick",
            "--size",
            "8MiB",
            "--links",
            "loopback",
            "--shapes",
            "small",
            "--scenarios",
            "load,copy",
            "--backends",
            "s3",
            "--contenders",
            "tensorstream,tensorizer,runai,s5cmd",
            "--exclude",
            "*/runai concurrency=*",
            "--exclude",
            "copy/*/s5cmd -c*",
            "--exclude",
            "copy/*/object/*",  # the folder copy covers listings too
            "--copy-size",
            "4MiB",
            "--folder",
            "4x256KiB",
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
        timeout=110,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    keys = {"scenario", "link", "shape", "backend", "contender", "seconds_median", "seconds_min"}
    keys |= {"seconds_max", "process_seconds_median", "peak_rss_mib", "verified", "status", "family"}
    assert all(keys <= set(r) for r in rows)
    ran = [r for r in rows if r["status"] not in ("skipped", "alias")]
    cells = {(r["scenario"], r["shape"]) for r in ran}
    assert cells >= {("load", "small"), ("copy", "folder")}
    # every measured row is verified against the generator's checksums
    assert ran and all(r["verified"] for r in ran), [r for r in ran if not r["verified"]]
    assert all(r["seconds_min"] <= r["seconds_median"] <= r["seconds_max"] for r in ran)
    # the link's warm-up run is printed and discarded: every row has its one round
    assert "(discarded)" in proc.stdout and proc.stdout.index("[warm-up") < proc.stdout.index("[r1")
    assert all(r["rounds"] == 1 for r in ran)
    # the peers ran too, not just tensorstream
    assert any(r["family"] == "tensorizer" for r in ran)
    # a skipped contender carries its reason; the excluded ones are listed, not dropped
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert all(r["note"] for r in skipped)
    assert any("excluded" in r["note"] for r in skipped)
    # workers count the page faults inside their clock (how their memory was faulted
    # in); external tools have none
    workers = [r for r in ran if r["scenario"] == "load"]
    assert workers and all(isinstance(r["minor_faults_median"], int) and r["minor_faults_median"] > 0
                           for r in workers)
    assert all(r["minor_faults_median"] is None for r in ran if r["scenario"] == "copy")
    # each cell has tensorstream's time and ratios against the peers' best
    load = next(c for c in data["cells"] if c["scenario"] == "load")
    assert load["tensorstream"]["seconds"] and load["peers"]["tensorizer"]["ratio"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = md.read_text()
    assert "| link | shape | backend |" in text and "vs best peer" in text
    assert "| peak RSS MiB | page faults | verified |" in text
    assert data["header"]["machine"]["cpus"] >= 1 and data["header"]["commit"]


def test_rounds_alternate_and_rotate_the_first_contender_of_each_cell() -> None:
    from benchmarks.contenders import Contender
    from benchmarks.run import round_order

    plan = [Contender("load", "http", n, [], "", "worker", shape="llama") for n in "ABC"] + [
        Contender("load", "http", n, [], "", "worker", shape="small") for n in "XY"
    ]
    names = [[plan[i].name for i in round_order(plan, r)] for r in range(4)]
    # the first rotates with the round and from cell to cell; odd rounds run the
    # rest backwards: no one always follows the same other
    assert names == [list("ABCYX"), list("BACXY"), list("CABYX"), list("ACBXY")]
    for cell in ("ABC", "XY"):
        firsts = [next(n for n in row if n in cell) for row in names]
        assert set(firsts) == set(cell)  # every contender of a cell goes first in turn
        followers = {(row[i], row[i + 1]) for row in names for i in range(len(row) - 1)
                     if row[i] in cell and row[i + 1] in cell}
        assert len(followers) == len(cell) * (len(cell) - 1)  # every neighbour, both ways
    # one round: cells do not all start with the same contender
    many = [Contender("load", "http", n, [], "", "worker", shape=s) for s in "abc" for n in "TU"]
    assert [many[i].name for i in round_order(many, 0)][::2] == ["T", "U", "T"]


def test_each_run_reads_again_the_files_its_contender_reads(tmp_path: Path) -> None:
    """A kernel that reclaims file pages idle for a minute let a cell's later rounds find
    its model on disk: each run warms its own files first, grouped by what reads them."""
    from benchmarks.contenders import Contender
    from benchmarks.run import COPY_FILES, _read_by, _serve_tree

    models = {}
    for shape in ("llama", "small"):
        d = tmp_path / "models" / shape
        d.mkdir(parents=True)
        for name in ("model.tensors", "model.safetensors"):
            (d / name).write_bytes(shape.encode())
        models[shape] = {"dir": str(d)}
    bdir = tmp_path / "blobs"
    (bdir / "folder").mkdir(parents=True)
    for name in ("object.bin", "one.bin", "folder/0.bin"):
        (bdir / name).write_bytes(b"x")
    blobs = {"dir": str(bdir), "object": {"name": "object.bin"}, "one_mib": {"name": "one.bin"},
             "folder": {"name": "folder", "files": ["0.bin"]}}
    files = _serve_tree(tmp_path / "root", models, blobs)
    assert set(files) == {"llama", "small", COPY_FILES}
    load = Contender("load", "http", "ts", [], "", "worker", shape="small")
    assert _read_by(load, files) == [Path(models["small"]["dir"]) / "model.tensors",
                                     Path(models["small"]["dir"]) / "model.safetensors"]
    for scenario, shape in (("copy", "folder"), ("startup", "cp 1 MiB")):
        c = Contender(scenario, "s3->local", "ts", [], "", "file", shape=shape)
        assert _read_by(c, files) == [bdir / "object.bin", bdir / "one.bin", bdir / "folder" / "0.bin"]
    assert (tmp_path / "root" / "bench" / "small" / "model.tensors").read_bytes() == b"small"


def test_summary_ratios_use_each_peer_familys_best_and_report_misses() -> None:
    from benchmarks.report import aggregate, summarize

    def row(name: str, family: str, secs: list[float] | None, ts: bool = False) -> dict:
        key = dict(
            scenario="load",
            link="paced",
            shape="small",
            backend="http",
            contender=name,
            family=family,
            tensorstream=ts,
        )
        runs = [dict(seconds=s, process_seconds=s + 2, verified=True) for s in secs or []]
        if secs is None:
            runs = [dict(seconds=None, process_seconds=1.0, error="exit 1: boom")]
        return aggregate(key, runs, 100 << 20, None)

    rows = [
        row("tensorstream", "tensorstream", [2.0, 2.2, 1.8], ts=True),
        row("tensorizer default (2)", "tensorizer", [8.0]),
        row("tensorizer num_readers=16", "tensorizer", [1.0, 1.2]),
        row("runai (defaults)", "runai", None),
    ]
    cell = summarize(rows)[0]
    assert cell["tensorstream"]["seconds"] == 2.0
    assert cell["peers"]["tensorizer"] == dict(
        contender="tensorizer num_readers=16", seconds=1.1, peak_rss_mib=None, ratio=0.55
    )
    assert cell["peers"]["tensorizer_default"]["ratio"] == 4.0
    assert cell["peers"]["runai"]["seconds"] is None  # a miss, shown
    # a fast wrong answer is a failure, not a time
    bad = aggregate({"contender": "x"}, [dict(seconds=0.1, process_seconds=1, verified=False)], 1, None)
    assert bad["status"] == "failed" and bad["seconds_median"] is None


def test_baseline_runs_beside_this_tree_in_copy_and_startup_cells(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--list", "--size", "8MiB", "--links", "loopback",
         "--scenarios", "copy,startup", "--contenders", "tensorstream,s5cmd", "--copy-size", "4MiB",
         "--folder", "2x256KiB", "--cache", str(tmp_path / "cache"), "--baseline", str(REPO / "src")],
        cwd=REPO, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for cell in ("copy/loopback/object", "copy/loopback/folder", "startup/loopback/cp 1 MiB"):
        assert f"{cell}/s3->local tensorstream cp (baseline): runs" in proc.stdout or (
            f"{cell}/process tensorstream cp (baseline): runs" in proc.stdout), proc.stdout


def test_children_get_bytecode_like_an_installed_package(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # PYTHONDONTWRITEBYTECODE (set on shared machines) made every tensorstream
    # child compile its modules again; the trees are compiled once instead.
    from benchmarks import run

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert "PYTHONDONTWRITEBYTECODE" not in run.child_env(tmp_path / "home")
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("X = 1\n")
    run.compile_trees([str(tree)])
    assert list((tree / "pkg" / "__pycache__").glob("mod.*.pyc"))


def test_worker_clock_waits_for_cuda_copies_and_makes_the_context_first() -> None:
    """A load onto CUDA is timed from a made context to the last landed copy; on the
    CPU the worker touches no CUDA at all (the CPU-only CI machine has none)."""
    import torch
    from benchmarks.worker import _cuda_ready

    for device in (None, "cpu"):
        sync = _cuda_ready(device)
        sync()  # a no-op
    if not torch.cuda.is_available():
        return
    calls: list[object] = []
    real = torch.cuda.synchronize
    try:
        torch.cuda.synchronize = lambda d=None: calls.append(d) or real(d)  # type: ignore[assignment]
        sync = _cuda_ready("cuda")
        assert calls == ["cuda"] and torch.cuda.is_initialized()
        sync()
        assert calls == ["cuda", "cuda"]
    finally:
        torch.cuda.synchronize = real  # type: ignore[assignment]
