"""What a device can still hold (tensorstream.headroom): the bound on what a file claims."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorstream.headroom import _cgroup_headroom, _meminfo, available_bytes


def test_the_cpu_figure_is_memavailable_and_free_swap_at_most() -> None:
    info = _meminfo()
    got = available_bytes(torch.device("cpu"))
    assert got is not None and 0 < got <= info["MemTotal"] + info.get("SwapTotal", 0)


def test_an_unknown_device_type_is_not_guessed() -> None:
    assert available_bytes(torch.device("meta")) is None


def _cgroup(tmp_path: Path, line: str, folder: str, files: dict[str, str]) -> int | None:
    tmp_path.mkdir(exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(line + "\n")
    where = tmp_path / "fs" / folder
    where.mkdir(parents=True)
    for name, text in files.items():
        (where / name).write_text(text)
    return _cgroup_headroom(proc, tmp_path / "fs")


@pytest.mark.parametrize("nested", [True, False])  # the cgroup's own path, or mounted as root
def test_a_v2_limit_leaves_limit_minus_usage_with_page_cache_counted_free(
        tmp_path: Path, nested: bool) -> None:
    got = _cgroup(tmp_path, "0::/pod/ctr", "pod/ctr" if nested else ".",
                  {"memory.max": "4000\n", "memory.current": "3000\n",
                   "memory.stat": "anon 2500\nfile 500\n"})
    assert got == 1500


def test_a_v1_limit_and_no_limit(tmp_path: Path) -> None:
    assert _cgroup(tmp_path, "4:memory:/x", "memory/x",
                   {"memory.limit_in_bytes": "8000", "memory.usage_in_bytes": "7000",
                    "memory.stat": "cache 10\ntotal_cache 100\n"}) == 1100
    assert _cgroup(tmp_path / "b", "0::/", ".", {"memory.max": "max\n"}) is None
