"""walk_local: a local source tree deeper than Python's recursion limit is walked."""

from __future__ import annotations

from pathlib import Path

from deep_tree import DEPTH, deep_tree
from tensorstream.copy.select import walk_local


def test_a_tree_deeper_than_the_recursion_limit_is_walked_in_order(tmp_path: Path) -> None:
    with deep_tree(tmp_path / "src"):
        (tmp_path / "src" / "a.bin").write_bytes(b"a")
        (tmp_path / "src" / "z.bin").write_bytes(b"z")
        files, skipped = walk_local(str(tmp_path / "src"))
    deep_key = "/".join(["d"] * DEPTH + ["bottom.bin"])
    assert [key for key, _ in files] == ["a.bin", deep_key, "z.bin"]  # depth first, by name
    assert skipped == []
