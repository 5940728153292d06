"""The key -> path mapper that keeps recursive copies inside their destination."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorstream.copy.keys import (
    UnsafeKeyError,
    open_dir_under,
    plan_keys,
    relative_key,
    safe_relative_key,
)

BAD_KEYS = ["../x", "a/../../x", "..", "/abs", "a//b", "a/./b", ".", "", "a\\..\\b", "x\x00y",
            "a/b/..", "./a"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(UnsafeKeyError):
        safe_relative_key(key)


@pytest.mark.parametrize("key", ["model.bin", "a/b/c.tensors", "..hidden", "a/...", "dir.d/x"])
def test_ordinary_keys_pass_unchanged(key: str) -> None:
    assert safe_relative_key(key) == key


def test_relative_key_does_not_match_sibling_prefix() -> None:
    assert relative_key("bucket/data/x", "bucket/data/") == "x"
    assert relative_key("bucket/data-evil/x", "bucket/data/") is None
    assert relative_key("anything", "") == "anything"


segment = st.one_of(st.sampled_from(["..", ".", "", "a", "b", "..a", "/", "\\"]),
                    st.text(min_size=0, max_size=4))


@settings(max_examples=400, deadline=None)
@given(st.lists(segment, min_size=1, max_size=6).map("/".join))
def test_fuzz_accepted_keys_stay_inside(key: str) -> None:
    root = "/dst/root"
    try:
        rel = safe_relative_key(key)
    except UnsafeKeyError:
        return
    joined = os.path.normpath(os.path.join(root, rel))
    assert os.path.commonpath([root, joined]) == root
    assert joined != root
    # No normalisation happened: the key maps to exactly one path.
    assert posixpath.normpath(rel) == rel


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "a/b", "a/b/c", "b", "a/", "c/", "../x", "a//b", "d/e"]),
                max_size=8))
def test_plan_is_deterministic_and_conflict_free(keys: list[str]) -> None:
    plan = plan_keys(keys, filesystem=True)
    again = plan_keys(list(reversed(keys)), filesystem=True)
    assert plan == again
    rels = [rel for _, rel in plan.copy]
    for r in rels:  # no copied key is a directory of another
        assert not any(o.startswith(r + "/") for o in rels)


def test_file_and_directory_conflict() -> None:
    plan = plan_keys(["a", "a/b", "dir/", "ok"], filesystem=True)
    assert plan.copy == [("a/b", "a/b"), ("ok", "ok")]
    assert [k for k, _ in plan.refused] == ["a"]
    assert plan.skipped == [("dir/", "directory marker")]
    # Object stores have no such conflict.
    assert [k for k, _ in plan_keys(["a", "a/b"], filesystem=False).copy] == ["a", "a/b"]


def test_open_dir_under_refuses_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "dst"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    fd = os.open(root, os.O_RDONLY)
    try:
        with pytest.raises(UnsafeKeyError):
            open_dir_under(fd, ["link", "x"])
        sub = open_dir_under(fd, ["new", "deeper"])
        os.close(sub)
    finally:
        os.close(fd)
    assert (root / "new" / "deeper").is_dir()
    assert list(outside.iterdir()) == []
