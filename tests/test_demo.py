"""``python -m tensorstream.demo`` (the README's first command): loads through
tensorstream's HTTP read path from its own loopback server, side by side with
tensorizer's stream, prints both times, and fails in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _demo(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        env.pop(name, None)  # loopback only: the demo is offline
    return subprocess.run([sys.executable, "-m", "tensorstream.demo", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_loads_through_tensorstream_over_http_next_to_tensorizer(tmp_path: Path) -> None:
    done = _demo("--size-mib", "16", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "every tensor verified" in out
    url = re.search(r"(http://127\.0\.0\.1:\d+/\S+)", out)
    assert url, out  # served over HTTP on loopback, not read as a local file
    ts = re.search(r"tensorstream\.deserialize\(url\)\s+([\d.]+) s\s+([\d.]+) GB/s\s+path=(\S+) "
                   r"readers=(\d+) requests=(\d+) retries=(\d+)", out)
    assert ts, out
    assert ts.group(3).split("+")[0] in ("streamed", "ranged")
    assert int(ts.group(5)) >= 1  # tensorstream's own requests
    assert re.search(r"tensorizer TensorDeserializer\(url\)\s+[\d.]+ s", out), out
    assert "tensorstream / tensorizer time:" in out
    assert "/tmp" not in out and "tensorstream-demo-" not in out  # no temp path, stale or not
    assert done.stderr.strip() == ""


def test_demo_keeps_the_file_when_asked(tmp_path: Path) -> None:
    done = _demo("--size-mib", "4", "--rounds", "1", "--path", str(tmp_path / "m.tensors"))
    assert done.returncode == 0, done.stderr
    assert f"kept at {tmp_path / 'm.tensors'}" in done.stdout
    assert (tmp_path / "m.tensors").stat().st_size > 4 << 20


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_demo_cuda_without_cuda_is_one_line() -> None:
    done = _demo("--device", "cuda", timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "CUDA is not available" in lines[0] and "device='cpu'" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
