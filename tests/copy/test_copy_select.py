"""walk_local: a local source tree deeper than Python's recursion limit is walked; links
to directories are followed, loops reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from deep_tree import DEPTH, deep_tree
from tensorstream.copy.select import unchanged, walk_local
from tensorstream.providers.base import ObjectInfo


def test_a_tree_deeper_than_the_recursion_limit_is_walked_in_order(tmp_path: Path) -> None:
    with deep_tree(tmp_path / "src"):
        (tmp_path / "src" / "a.bin").write_bytes(b"a")
        (tmp_path / "src" / "z.bin").write_bytes(b"z")
        files, skipped = walk_local(str(tmp_path / "src"))
    deep_key = "/".join(["d"] * DEPTH + ["bottom.bin"])
    assert [key for key, _ in files] == ["a.bin", deep_key, "z.bin"]  # depth first, by name
    assert skipped == []


def test_a_second_link_to_a_directory_is_walked_and_only_a_loop_is_refused(tmp_path: Path) -> None:
    """`latest -> v2` beside the real `v2/`: both are walked (as cp -rL copies them). The
    real `v2` was reported as "symbolic link loop (directory already copied)" and left out
    (exit 3), because `latest` sorted first and claimed the directory."""
    src = tmp_path / "src"
    (src / "v2").mkdir(parents=True)
    (src / "v2" / "weights").write_bytes(b"w")
    (src / "latest").symlink_to("v2")
    (src / "v2" / "self").symlink_to("../v2")  # a loop: a link to a directory it is in
    (src / "top").symlink_to(".")  # a loop to the top itself
    files, skipped = walk_local(str(src))
    assert [key for key, _ in files] == ["latest/weights", "v2/weights"]
    assert sorted(key for key, _ in skipped) == ["latest/self", "top", "v2/self"]
    assert all("loop" in why for _, why in skipped)


_A, _B = "a" * 32, "b" * 32


@pytest.mark.parametrize(("src", "dst", "decide"), [
    (f'"{_A}"', _B.upper(), True),  # quoted or not, either case: one PutObject each
    (f"{_A}-2", f'"{_B}-2"', True),  # two parts each
    (f"{_A}-0", _B, True),  # "-0" is counted as one piece
    (f"{_A}-2", f"{_B}-3", False),  # two part counts
    (_A, f"{_B}-1", False),  # one PutObject, one part
    ("a" * 31, "b" * 31, False),  # too short for an MD5
    ("g" * 32, _B, False),  # not hex
    (f'W/"{_A}"', _B, False),  # a weak validator (HTTP), no MD5
    (f"{_A}-x", f"{_B}-x", False),  # no part count
])
def test_etags_decide_only_as_md5s_of_one_layout(src: str, dst: str, decide: bool) -> None:
    # A copy newer than its source: differing ETags that decide call it changed; ETags
    # that cannot leave it to the dates, which call it unchanged.
    def info(etag: str, mtime: float) -> ObjectInfo:
        return ObjectInfo(path="k", size=10, etag=etag, mtime=mtime)

    assert unchanged(info(src, 0), info(dst, 1), same_kind=True) is not decide
    assert unchanged(info(src, 0), info(dst, 1), same_kind=False)  # (other kinds: dates)
