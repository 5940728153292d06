"""examples/distributed_load.py runs as documented: under torchrun and with
torch.multiprocessing.spawn, every rank ends with the same tensors. And the
benchmark of issue 20 runs end to end (tiny, verified)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from tensor_files import tensorizer_bytes
from tensorstream.testing.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "distributed_load.py"
LINE = re.compile(r"rank (\d)/2: (\d+) tensors, checksum ([0-9a-f]{16}), [\d.]+ s(.*)")

pytestmark = [pytest.mark.slow]


def _ranks(out: str) -> dict[int, tuple[int, str, str]]:
    found = {int(m.group(1)): (int(m.group(2)), m.group(3), m.group(4))
             for m in LINE.finditer(out)}
    assert sorted(found) == [0, 1], out
    assert len({c for _, c, _ in found.values()}) == 1, out  # the same tensors on every rank
    return found


@pytest.mark.timeout(180)
def test_example_with_spawn_tensorizer_over_http(http_server: Any, tmp_path: Path) -> None:
    state = {f"w{i}": torch.randn(50_000) for i in range(6)}
    key = f"example-{uuid.uuid4().hex}.tensors"
    http_server.put(key, tensorizer_bytes(state, tmp_path))
    out = subprocess.run([sys.executable, str(EXAMPLE), "--spawn", "2", http_server.url(key)],
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = _ranks(out.stdout)
    assert all(n == 6 and "pulled" in extra for n, _, extra in ranks.values()), out.stdout


@pytest.mark.timeout(180)
def test_example_under_torchrun_safetensors(tmp_path: Path) -> None:
    st_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "model.safetensors"
    st_torch.save_file({"a": torch.randn(300, 40), "b": torch.arange(10)}, str(path))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE),
         str(path)], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = _ranks(out.stdout)
    assert all(n == 2 for n, _, _ in ranks.values()), out.stdout


@pytest.mark.timeout(240)
def test_distributed_benchmark_runs_and_verifies(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.distributed", "--ranks", "2", "--size", "4MiB",
         "--rounds", "1", "--cache", str(tmp_path / "cache"), "--json", str(tmp_path / "r.json")],
        cwd=REPO, capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    by = {r["contender"]: r for r in rows}
    assert set(by) == {"group", "independent"} and all(r["verified"] for r in rows)
    size = json.loads((tmp_path / "r.json").read_text())["manifest"]["file_size"]
    assert by["group"]["pulled"] < 1.5 * size <= by["independent"]["pulled"], rows
    assert by["group"]["served"] < 1.5 * size <= by["independent"]["served"], rows
    assert "independent / group load time" in out.stdout
