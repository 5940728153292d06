"""Listing a local prefix: deep trees, and only the entries the prefix names."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tensorstream
from deep_tree import deep_tree


def _list(prefix: str) -> list[str]:
    async def go() -> list[str]:
        async with tensorstream.get_provider(prefix) as p:
            return [info.path async for info in p.list(prefix)]
    return asyncio.run(go())


def test_a_tree_deeper_than_the_recursion_limit_is_listed(tmp_path: Path) -> None:
    with deep_tree(tmp_path / "tree") as leaf:
        (tmp_path / "tree" / "top.bin").write_bytes(b"top")
        got = _list(str(tmp_path / "tree"))
        assert got == sorted([str(leaf / "bottom.bin"), str(tmp_path / "tree" / "top.bin")])


def test_a_name_prefix_walks_only_the_entries_it_names(tmp_path: Path) -> None:
    (tmp_path / "model-a").mkdir()
    (tmp_path / "model-a" / "w.bin").write_bytes(b"a")
    (tmp_path / "model-a.json").write_bytes(b"{}")
    (tmp_path / "other.bin").write_bytes(b"o")
    with deep_tree(tmp_path / "sibling"):  # walking it (all of tmp_path): RecursionError
        assert _list(str(tmp_path / "model-a")) == [str(tmp_path / "model-a" / "w.bin")]
        assert _list(str(tmp_path / "model")) == sorted(
            [str(tmp_path / "model-a" / "w.bin"), str(tmp_path / "model-a.json")])
        assert _list(str(tmp_path / "nothing-here")) == []
