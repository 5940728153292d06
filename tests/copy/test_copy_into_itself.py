"""A copy into a place inside its own source (``cp -r src src/bk``, ``sync s3://b/p
s3://b/p/bk``) is refused where it would read what it writes, and runs where the
rules leave what it writes out of the source: decided by the rules themselves
(:meth:`Rules.wants`), for every spelling of the two places."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from mount_namespace import can_bind_mount
from tensorstream.copy.engine import copy, copy_tree
from tensorstream.copy.select import Rules

#: (rules, copied): every rule set that leaves SRC/bk/ out of SRC runs; the others are
#: refused. (The check knew only 'bk/*' and 'bk/**', and refused any --include after.)
CASES = [
    ([], False),
    ([("exclude", "bk/*")], True),
    ([("exclude", "bk/**")], True),
    ([("exclude", "bk*")], True),  # (refused before)
    ([("exclude", "*")], True),  # nothing copied at all  (refused before)
    ([("exclude", "bk/")], False),  # matches no key: a key is a file, 'bk/' none
    ([("exclude", "bk")], False),
    ([("exclude", "bk/*.bin")], False),  # the copy of d/c.txt is bk/d/c.txt
    ([("exclude", "bk/*"), ("include", "d/*")], True),  # (refused before)
    ([("exclude", "*"), ("include", "a.bin")], True),  # (refused before)
    ([("exclude", "bk/*"), ("include", "*.txt")], False),  # takes bk/d/c.txt back
    ([("exclude", "bk/*"), ("include", "*")], False),
    ([("exclude", "x"), ("include", "bk/*"), ("exclude", "bk/*")], True),  # the last match
]


def _tree(top: Path) -> None:
    (top / "d").mkdir(parents=True)
    (top / "a.bin").write_bytes(b"a")
    (top / "d" / "c.txt").write_bytes(b"c")


def _files(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file())


@pytest.mark.parametrize("rules,copied", CASES)
def test_the_rules_decide_whether_a_directory_is_copied_into_itself(
        tmp_path: Path, rules: list[tuple[str, str]], copied: bool) -> None:
    src = tmp_path / "src"
    _tree(src)
    before = _files(src)
    for _ in range(2):  # a second run copies nothing a level deeper
        result = copy_tree(str(src), str(src / "bk"), include=Rules(rules))
        if not copied:
            assert not result.ok and len(result.errors) == 1, result.errors
            assert "cannot copy a directory into itself" in result.errors[0]
            assert "--exclude 'bk/*'" in result.errors[0]
            assert _files(src) == before
            return
        assert result.ok, result.errors
    wanted = Rules(rules)
    assert _files(src) == sorted(before + [f"bk/{k}" for k in before if wanted.wants(k)])


@pytest.mark.parametrize("dest", ["{src}/bk/", "{src}/./bk", "{src}//bk", "{src}/d/../bk",
                                  "{link}/bk", "{dlink}"])
def test_every_spelling_of_a_destination_inside_is_seen(tmp_path: Path, dest: str) -> None:
    src = tmp_path / "src"
    _tree(src)
    (src / "bk").mkdir()
    (tmp_path / "link").symlink_to(src)
    (tmp_path / "dlink").symlink_to(src / "bk")
    target = dest.format(src=src, link=tmp_path / "link", dlink=tmp_path / "dlink")
    result = copy_tree(str(src), target)
    assert not result.ok and "into itself" in result.errors[0], result.errors
    result = copy_tree(f"{src}/", target, include=Rules([("exclude", "bk/*")]))
    assert result.ok, result.errors
    assert _files(src) == ["a.bin", "bk/a.bin", "bk/d/c.txt", "d/c.txt"]


def test_a_source_reached_through_a_link_or_dot_is_seen(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    (tmp_path / "link").symlink_to(src)
    for source in (tmp_path / "link", f"{src}/.", f"{tmp_path}//src/"):
        result = copy_tree(str(source), str(src / "bk"))
        assert not result.ok and "into itself" in result.errors[0], result.errors
    assert _files(src) == ["a.bin", "d/c.txt"]


def test_an_earlier_copy_under_dst_is_named(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    (src / "bk").mkdir()
    (src / "bk" / "old.bin").write_bytes(b"o")  # an earlier run's copy, say
    result = copy_tree(str(src), str(src / "bk"),
                       include=Rules([("exclude", "*"), ("include", "bk/*")]))
    assert not result.ok and "bk/old.bin is under it" in result.errors[0], result.errors


@pytest.mark.parametrize("rules,copied", [([("exclude", "bk*")], True),
                                          ([("exclude", "bk/")], False),
                                          ([("exclude", "bk/*"), ("include", "d/*")], True)])
def test_the_rules_decide_for_a_prefix_too(moto_s3: Any, rules: list[tuple[str, str]],
                                           copied: bool) -> None:
    top = f"into-{os.urandom(4).hex()}"
    for key in ("a.bin", "d/c.txt"):
        moto_s3.put(S3_BUCKET, f"{top}/{key}", key.encode())
    result = copy_tree(f"s3://{S3_BUCKET}/{top}/", f"s3://{S3_BUCKET}/{top}/bk/",
                       include=Rules(rules), **moto_s3.options())
    if copied:
        assert result.ok, result.errors
        assert moto_s3.get(S3_BUCKET, f"{top}/bk/a.bin") == b"a.bin"
    else:
        assert not result.ok and "cannot copy a prefix into itself" in result.errors[0]
        assert not moto_s3.exists(S3_BUCKET, f"{top}/bk/a.bin")


def test_a_source_whose_link_leads_into_the_destination_is_refused(tmp_path: Path) -> None:
    """``src/cache -> ../out`` and ``cp -r src out``: the walk follows the link into DST,
    so each run copied the last run's copies again (out/cache/cache/...): refused, unless
    the link is left out (--exclude, --no-follow-symlinks)."""
    src, out = tmp_path / "src", tmp_path / "out"
    _tree(src)
    out.mkdir()
    (out / "old.bin").write_bytes(b"o")
    (src / "cache").symlink_to(out)
    result = copy_tree(str(src), str(out))
    assert not result.ok and len(result.errors) == 1, result.errors
    assert "cache/old.bin is in" in result.errors[0] and "symbolic link" in result.errors[0]
    assert "--no-follow-symlinks" in result.errors[0] and "--exclude 'cache/*'" in result.errors[0]
    assert _files(out) == ["old.bin"]
    for options in ({"include": Rules([("exclude", "cache/*")])}, {"follow_symlinks": False}):
        result = copy_tree(str(src), str(out), **options)  # type: ignore[arg-type]
        assert result.ok, result.errors
    assert _files(out) == ["a.bin", "d/c.txt", "old.bin"]


def test_a_link_to_elsewhere_and_a_copy_into_the_parent_are_copied(tmp_path: Path) -> None:
    # The neighbours: a link out of SRC that does not lead into DST, and SRC inside DST.
    src, out, other = tmp_path / "top" / "src", tmp_path / "out", tmp_path / "other"
    _tree(src)
    other.mkdir()
    (other / "x.bin").write_bytes(b"x")
    (src / "ext").symlink_to(other)
    assert copy_tree(str(src), str(out)).ok
    assert _files(out) == ["a.bin", "d/c.txt", "ext/x.bin"]
    result = copy_tree(str(src), str(tmp_path / "top"))
    assert result.ok, result.errors


#: Run in a mount namespace of its own (``unshare -rm``): SRC bound at VIEW, then copies
#: into VIEW/bk (inside SRC by the bind mount), VIEW/bk with bk/* left out, VIEW (SRC
#: itself) and OUT (beside it); each result as a line of JSON.
_BOUND = """\
import json, subprocess, sys
from tensorstream.copy.engine import copy, copy_tree
from tensorstream.copy.select import Rules
src, view, out = sys.argv[1:]
subprocess.run(["mount", "--bind", src, view], check=True)
for dest, rules in ((view + "/bk", []), (view + "/bk", [("exclude", "bk/*")]), (view, []),
                    (out, [])):
    result = copy_tree(src, dest, include=Rules(rules))
    print(json.dumps([result.ok, result.errors]))
"""


def test_a_destination_inside_the_source_by_a_bind_mount_is_seen(tmp_path: Path) -> None:
    """SRC bound elsewhere (a container's volume) and DST under that other path: no
    realpath tells, so each run copied the last run's copies a level deeper."""
    if not can_bind_mount(tmp_path):
        pytest.skip("no mount namespace of one's own here (unshare -rm)")
    src, view, out = tmp_path / "src", tmp_path / "view", tmp_path / "out"
    _tree(src)
    view.mkdir()
    proc = subprocess.run(["unshare", "-rm", sys.executable, "-c", _BOUND, str(src), str(view),
                           str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    inside, left_out, itself, beside = (json.loads(line) for line in proc.stdout.splitlines())
    assert not inside[0] and len(inside[1]) == 1, inside
    assert "cannot copy a directory into itself" in inside[1][0], inside
    assert "--exclude 'bk/*'" in inside[1][0]
    assert left_out == [True, []]  # the neighbours: rules leaving DST out, SRC onto itself
    assert not itself[0] and all("same object" in e for e in itself[1]), itself
    assert beside == [True, []]  # and a place beside SRC
    assert _files(src) == ["a.bin", "bk/a.bin", "bk/d/c.txt", "d/c.txt"]
    assert _files(out) == _files(src)


@pytest.mark.parametrize("pattern,rules,copied", [
    ("p/*", [], False),  # p/bk/a.bin, its copy, is matched by p/* on the next run
    ("p/*.bin", [], False),
    ("p/*", [("exclude", "bk/*")], True),
    ("p/a*", [], True),  # the copies (p/bk/a.bin) are no match of p/a*
    ("p/d/*", [], True),  # DST is beside the pattern's base, not under it
])
@pytest.mark.parametrize("recursive", [True, False])
def test_a_wildcard_source_is_seen_too(moto_s3: Any, pattern: str,
                                       rules: list[tuple[str, str]], copied: bool,
                                       recursive: bool) -> None:
    """``cp 's3://b/p/*' s3://b/p/bk/``: a pattern was left to its own affairs, and each run
    copied the last run's copies a level deeper (p/bk/bk/a.bin, p/bk/bk/d/c.bin)."""
    top = f"into-{os.urandom(4).hex()}"
    for key in ("p/a.bin", "p/d/c.bin"):
        moto_s3.put(S3_BUCKET, f"{top}/{key}", key.encode())
    for _ in range(2):  # a second run copies nothing a level deeper
        result = (copy_tree if recursive else copy)(
            f"s3://{S3_BUCKET}/{top}/{pattern}", f"s3://{S3_BUCKET}/{top}/p/bk/",
            include=Rules(rules), **moto_s3.options())
        if not copied:
            assert not result.ok and len(result.errors) == 1, result.errors
            assert "cannot copy a prefix into itself" in result.errors[0], result.errors
            assert "--exclude 'bk/*'" in result.errors[0]
            assert not moto_s3.exists(S3_BUCKET, f"{top}/p/bk/a.bin")
            return
        assert result.ok, result.errors
    copies = {o.dst.rsplit(f"{top}/", 1)[1] for o in result.outcomes}
    assert copies and not any(c.startswith("p/bk/bk/") for c in copies), copies
    assert not moto_s3.exists(S3_BUCKET, f"{top}/p/bk/bk/a.bin")
