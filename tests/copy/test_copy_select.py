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
    (f"{_A}-2", f'"{_B}-2"', False),  # two parts each, of sizes S3 does not list
    (f"{_A}-0", _B, True),  # "-0" is counted as one piece
    (f"{_A}-2", f"{_B}-3", False),  # two part counts
    (_A, f"{_B}-1", False),  # one PutObject, one part
    ("a" * 31, "b" * 31, False),  # too short for an MD5
    ("g" * 32, _B, False),  # not hex
    (f'W/"{_A}"', _B, False),  # a weak validator (HTTP), no MD5
    (f"{_A}-x", f"{_B}-x", False),  # no part count
])
def test_etags_decide_only_as_md5s_of_one_piece_each(src: str, dst: str, decide: bool) -> None:
    # A copy newer than its source: differing ETags that decide call it changed; ETags
    # that cannot leave it to the dates, which call it unchanged.
    def info(etag: str, mtime: float) -> ObjectInfo:
        return ObjectInfo(path="k", size=10, etag=etag, mtime=mtime)

    assert unchanged(info(src, 0), info(dst, 1), same_kind=True) is not decide
    assert unchanged(info(src, 0), info(dst, 1), same_kind=False)  # (other kinds: dates)


@pytest.mark.parametrize("rules", [[("include", "*.pt")], [("include", "a/*"), ("exclude", "*")],
                                   [("include", "*"), ("include", "*.pt")]])
def test_an_include_before_any_exclude_is_refused_as_the_cli_refuses_it(
        tmp_path: Path, rules: list[tuple[str, str]]) -> None:
    """``copy(include=Rules([("include", "*.pt")]))`` copied everything (the include took
    nothing back: all is included to begin with), where ``cp --include '*.pt'`` is a usage
    error; an s5cmd or rclone user's "only these" took all. Refused at once now, saying what
    to write; nothing is copied."""
    from tensorstream import copy
    from tensorstream.copy.select import Rules
    from tensorstream.errors import ConfigurationError

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.pt").write_bytes(b"a")
    (tmp_path / "src" / "b.bin").write_bytes(b"b")
    first = rules[0][1]
    with pytest.raises(ConfigurationError) as caught:
        copy(str(tmp_path / "src"), str(tmp_path / "out"), recursive=True,
             include=Rules(rules))
    assert str(caught.value) == (
        f"Rules: ('include', {first!r}) before any ('exclude', ...) changes nothing: "
        "everything is included to begin with and the last rule that matches a key decides "
        "(aws s3's order); to take only these, write Rules([('exclude', '*'), ('include', "
        f"{first!r})])")
    assert isinstance(caught.value, ValueError) and not (tmp_path / "out").exists()


def test_rules_that_start_with_an_exclude_select_as_before(tmp_path: Path) -> None:
    """The neighbours of the refusal: an exclude first (then includes), excludes only, none."""
    from tensorstream.copy.select import Rules

    assert Rules([("exclude", "*"), ("include", "*.pt")]).wants("a.pt")
    assert not Rules([("exclude", "*"), ("include", "*.pt")]).wants("b.bin")
    assert not Rules([("exclude", "*.bin"), ("include", "x*"), ("exclude", "xy*")]).wants("xy.bin")
    assert Rules([("exclude", "*.bin")]).wants("a.pt") and Rules().wants("a.bin")
    with pytest.raises(ValueError, match="rule kind must be exclude or include"):
        Rules([("exclud", "*")])
