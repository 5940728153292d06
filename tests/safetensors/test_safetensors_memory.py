"""safetensors.load and iter_tensors on the CPU allocate their next tensors early and announce
them, so the read-ahead of a paced link lands straight in the tensors: no read-ahead buffers,
no copies (the reason load's peak memory is its tensors, not its tensors plus the read-ahead
window)."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

MiB = 1 << 20
OPTIONS: dict[str, Any] = dict(part_size=256 << 10, readahead=4 * MiB, concurrency=16,
                               stream_reads=False)


def _read_ahead_stats(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    out = []
    for rec in caplog.records:
        m = re.search(r"read-ahead of .* done: (\{.*\})$", rec.getMessage())
        if m:
            out.append(ast.literal_eval(m.group(1)))
    return out


@pytest.fixture
def paced_model(http_server: HTTPTestServer, http_reset: None,
                tmp_path: Path) -> tuple[str, dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    tensors = {f"layers.{i}.w": torch.randn(768 + 64 * i, 1024, generator=g)  # 3-5 MiB each
           for i in range(5)}
    tensors["norm"] = torch.ones(1024)  # small ones share segments
    tensors["bias"] = torch.zeros(77)
    st_torch.save_file(tensors, str(tmp_path / "m.safetensors"))
    http_server.put("mem/m.safetensors", (tmp_path / "m.safetensors").read_bytes())
    http_server.faults.key = "mem/m.safetensors"
    http_server.faults.rate_limit = 24 * MiB
    return http_server.url("mem/m.safetensors"), tensors


def _load_exactly(how: str, url: str, tensors: dict[str, Any],
                  caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """Load ``url`` with ``how``, check every tensor, return the read-ahead
    statistics of the readers that moved bytes."""
    with caplog.at_level(logging.DEBUG, logger="tensorstream.readahead"):
        if how == "load":
            got = tensorstream.safetensors.load(url, **OPTIONS)
        else:
            got = dict(tensorstream.safetensors.iter_tensors(url, **OPTIONS))
    assert all(torch.equal(got[n], t) for n, t in tensors.items())
    return [s for s in _read_ahead_stats(caplog) if s["direct_bytes"] + s["copied_bytes"] > 0]


@pytest.mark.parametrize("how", ["load", "iter_tensors"])
def test_read_ahead_lands_in_the_tensors(how: str, paced_model: tuple[str, dict[str, Any]],
                                         caplog: pytest.LogCaptureFixture) -> None:
    url, tensors = paced_model
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    stats = _load_exactly(how, url, tensors, caplog)
    assert stats
    copied = sum(s["copied_bytes"] for s in stats)
    assert copied < 64 << 10, stats  # only the small tensors' bytes
    assert sum(s["direct_bytes"] for s in stats) >= total - (64 << 10)
    assert max(s["readahead_peak"] for s in stats) <= 2 * OPTIONS["part_size"], stats


def test_without_announced_tensors_read_ahead_uses_its_buffers(
        paced_model: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: the same load with StreamReader.expect doing nothing copies its bytes.
    monkeypatch.setattr(tensorstream.StreamReader, "expect", lambda self, offset, buffer: None)
    url, tensors = paced_model
    with caplog.at_level(logging.DEBUG, logger="tensorstream.readahead"):
        got = tensorstream.safetensors.load(url, **OPTIONS)
    assert all(torch.equal(got[n], t) for n, t in tensors.items())
    stats = _read_ahead_stats(caplog)
    assert sum(s["copied_bytes"] for s in stats) > 1 * MiB, stats
    assert max(s["readahead_peak"] for s in stats) > 4 * OPTIONS["part_size"], stats


@pytest.fixture
def paced_small_tensors(http_server: HTTPTestServer, http_reset: None,
                        tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Tensors smaller than a request (``part_size``): before, several shared one
    request, received into a read-ahead buffer and copied out."""
    g = torch.Generator().manual_seed(2)
    tensors = {f"t{i:02d}": torch.randn(16 + (i * 7) % 48, 1024, generator=g)  # 64-252 KiB
               for i in range(40)}
    tensors["tiny.a"] = torch.ones(100)  # tiny ones still share requests
    tensors["tiny.b"] = torch.zeros(3)
    st_torch.save_file(tensors, str(tmp_path / "s.safetensors"))
    http_server.put("mem/s.safetensors", (tmp_path / "s.safetensors").read_bytes())
    http_server.faults.key = "mem/s.safetensors"
    http_server.faults.rate_limit = 24 * MiB
    return http_server.url("mem/s.safetensors"), tensors


@pytest.mark.parametrize("how", ["load", "iter_tensors"])
def test_read_ahead_lands_in_tensors_smaller_than_a_request(
        how: str, paced_small_tensors: tuple[str, dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    url, tensors = paced_small_tensors
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    stats = _load_exactly(how, url, tensors, caplog)
    assert sum(s["copied_bytes"] for s in stats) < 64 << 10, stats  # the tiny ones only
    assert sum(s["direct_bytes"] for s in stats) >= total - (64 << 10)
    assert max(s["readahead_peak"] for s in stats) <= 2 * OPTIONS["part_size"], stats



def _sparse_file(path: Path, nbytes: int) -> Path:
    """A valid safetensors file of one U8 tensor of ``nbytes``, its data a hole (no disk)."""
    import json
    import struct

    body = json.dumps({"a": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]},
                       "b": {"dtype": "U8", "shape": [4], "data_offsets": [nbytes, nbytes + 4]}},
                      separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body)
        f.truncate(8 + len(body) + nbytes + 4)
    return path


def test_a_file_larger_than_memory_is_refused_before_allocating(tmp_path: Path) -> None:
    """A 1 TiB file (sparse) loaded onto the CPU was allocated and failed, or killed the
    process; it is refused with what it claims and what is available, before allocating."""
    path = _sparse_file(tmp_path / "huge.safetensors", 1 << 40)
    with pytest.raises(tensorstream.errors.InsufficientMemoryError) as info:
        tensorstream.safetensors.load(path)
    err = info.value
    assert isinstance(err, MemoryError) and err.claimed == (1 << 40) + 4 and err.limit < 1 << 40
    assert "huge.safetensors" in str(err) and "max_tensor_bytes" in str(err)
    # filter loads what fits; max_tensor_bytes is an allowance of the caller's, per file
    assert tensorstream.safetensors.load(path, filter={"b"})["b"].tolist() == [0, 0, 0, 0]
    with pytest.raises(tensorstream.errors.InsufficientMemoryError, match="max_tensor_bytes=3"):
        tensorstream.safetensors.load(path, filter={"b"}, max_tensor_bytes=3)
    with pytest.raises(tensorstream.errors.ConfigurationError, match="max_tensor_bytes must"):
        tensorstream.safetensors.load(path, filter={"b"}, max_tensor_bytes="lots")


def test_iter_tensors_and_open_refuse_one_tensor_larger_than_memory(tmp_path: Path) -> None:
    # torch's allocator raised a bare RuntimeError (or the process was killed later)
    path = _sparse_file(tmp_path / "huge.safetensors", 1 << 40)
    with pytest.raises(tensorstream.errors.InsufficientMemoryError, match="tensor 'a'") as info:
        for _ in tensorstream.safetensors.iter_tensors(path):
            pass
    assert "huge.safetensors" in str(info.value) and "get_slice" in str(info.value)
    with tensorstream.safetensors.open(path) as f:
        with pytest.raises(tensorstream.errors.InsufficientMemoryError, match="tensor 'a'"):
            f.get_tensor("a")
        assert f.get_slice("a")[:3].tolist() == [0, 0, 0]  # a part of it still reads
        assert f.get_tensor("b").tolist() == [0, 0, 0, 0]


def test_a_slice_larger_than_memory_is_refused_before_allocating(tmp_path: Path) -> None:
    """``get_slice(name)[::2]`` (or ``[1:]``) of a 1 TiB tensor allocated what it reads with
    torch's allocator: a bare ``RuntimeError``, or the process killed once the pages were
    touched. It is refused first, naming the file and the tensor; a small part still reads."""
    path = _sparse_file(tmp_path / "huge.safetensors", 1 << 40)
    with tensorstream.safetensors.open(path) as f:
        for key in (slice(None, None, 2), slice(1, None)):
            with pytest.raises(tensorstream.errors.InsufficientMemoryError,
                               match="a slice of tensor 'a'") as info:
                f.get_slice("a")[key]
            assert "huge.safetensors" in str(info.value) and "fewer rows" in str(info.value)
        assert f.get_slice("a")[5:8].tolist() == [0, 0, 0]


_PEAK = """
import sys, torch, tensorstream.safetensors as ts
def status(key):  # VmHWM, not ru_maxrss: that keeps the parent's RSS across fork and exec
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) >> 10
base = status("VmRSS")
got = ts.load(sys.argv[1], dtype=torch.float16, **eval(sys.argv[2]))
assert all(t.dtype == torch.float16 for t in got.values())
print(status("VmHWM") - base)
"""


@pytest.mark.parametrize("options", ["{}", "{'timeout_total': 100}"])
def test_a_cast_local_load_holds_the_cast_tensors_not_the_file_too(tmp_path: Path,
                                                                   options: str) -> None:
    """``load(local, dtype=torch.float16)`` of float32 weights mapped every float32 tensor
    first (one mapping for the whole file) and kept it to the end: peak RSS was the file
    plus its cast (774 MiB over the imports for 512 MiB of float32, 256 MiB of result).
    Each float32 tensor is now read into a mapping of its own, unmapped once it is cast:
    the result plus a few tensors (with ``torch.empty`` the allocator kept up to 100 MiB
    more of them here)."""
    import subprocess
    import sys

    g = torch.Generator().manual_seed(2)
    path = tmp_path / "f32.safetensors"
    st_torch.save_file({f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(48)},
                       str(path))  # 192 MiB of float32, 96 MiB once cast
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path), options], check=True,
                         capture_output=True, text=True).stdout
    assert int(out) < 150, out  # 107-112 MiB; was 292: 192 MiB mapped + 96 MiB cast
