"""A Redis root holding a damaged object beside good ones (a tensorizer ``to_redis``
prefix with a gap, a tensorstream manifest with impossible numbers): ``cp -r`` and
``sync`` copy the rest, fail the damaged objects they select by name, and never look
at one the rules leave out; ``sync --delete`` keeps a damaged object's copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli

DB = 13  # a database of this file's own


@pytest.fixture
def root(redis_server: Any) -> Iterator[str]:
    with redis_server.client(db=DB) as c:
        c.flushdb()
        c.set("good1", b"one")
        c.set("dir/good2", b"two")
        c.set("tz:header:0", b"h" * 10)  # a to_redis prefix whose bytes 10-499 are missing
        c.set("tz:data:500", b"d" * 10)
        c.hset("man", mapping={"tensorstream": "1", "size": "-5", "chunk_size": "1000",
                               "generation": "0123456789abcdef"})
    yield redis_server.url("", db=DB)
    with redis_server.client(db=DB) as c:
        c.flushdb()


def _files(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in top.rglob("*") if p.is_file()}


@pytest.mark.parametrize("cmd", [["cp", "-r"], ["sync"]])
def test_damaged_objects_left_out_are_never_looked_at(root: str, tmp_path: Path,
                                                      cmd: list[str]) -> None:
    # It failed whole: "tensorstream: error: ... not one contiguous stream", --exclude or not.
    out = tmp_path / "out"
    r = cli(*cmd, "--exclude", "tz*", "--exclude", "man", root, f"{out}/")
    assert r.returncode == 0, r.stderr
    assert _files(out) == {"good1": b"one", "dir/good2": b"two"}


@pytest.mark.parametrize("cmd", [["cp", "-r"], ["sync"]])
def test_damaged_objects_selected_fail_by_name_and_the_rest_is_copied(
        root: str, tmp_path: Path, cmd: list[str]) -> None:
    out = tmp_path / "out"
    r = cli(*cmd, root, f"{out}/")
    assert r.returncode == 3, r.stderr  # partial: some copied, some failed
    assert _files(out) == {"good1": b"one", "dir/good2": b"two"}
    errors = [line for line in r.stderr.splitlines() if "error" in line or "failed" in line]
    assert any("tz" in line and "contiguous" in line for line in errors), r.stderr
    assert any("'man'" in line and "corrupt" in line for line in errors), r.stderr


def test_sync_delete_keeps_the_copy_of_a_damaged_object(root: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "tz").write_bytes(b"an earlier copy")
    (out / "stale").write_bytes(b"gone from the source")
    r = cli("sync", "--delete", "--exclude", "tz*", "--exclude", "man", root, f"{out}/")
    assert r.returncode == 0, r.stderr
    # (excluded keys are not deleted at DST either; 'stale' is not under SRC)
    assert _files(out) == {"good1": b"one", "dir/good2": b"two", "tz": b"an earlier copy"}
    (out / "stale").write_bytes(b"gone from the source")
    r = cli("sync", "--delete", root, f"{out}/")
    assert r.returncode == 3, r.stderr
    assert (out / "tz").read_bytes() == b"an earlier copy" and (out / "stale").exists()


def test_ls_shows_the_rest_and_names_each_damaged_object(root: str) -> None:
    r = cli("ls", "-r", root)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[-1] for line in r.stdout.splitlines()) == ["dir/good2", "good1"]
    assert "'tz'" in r.stderr and "'man'" in r.stderr, r.stderr


def test_rm_r_leaves_out_what_the_rules_leave_out_and_deletes_the_damaged_ones(
        root: str, redis_server: Any) -> None:
    # It failed whole as cp -r did: nothing deleted, --exclude or not. Then it failed the
    # damaged two by name (exit 3), and nothing could delete them but redis-cli.
    r = cli("rm", "-r", "--exclude", "tz*", "--exclude", "man", "--exclude", "dir/*", root)
    assert r.returncode == 0, r.stderr
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys()) == [b"dir/good2", b"man", b"tz:data:500", b"tz:header:0"]
    r = cli("rm", "-r", root)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split("?")[0].rsplit("/", 1)[-1] for line in r.stdout.splitlines()) == [
        "good2", "man", "tz"]
    assert "deleted the damaged object 'man'" in r.stderr, r.stderr
    assert "deleted the damaged object 'tz'" in r.stderr, r.stderr
    with redis_server.client(db=DB) as c:
        assert c.keys() == []


GEN, OTHER_GEN = "0123456789abcdef", "fedcba9876543210"


def test_rm_of_a_corrupt_manifest_deletes_it_and_its_chunks_only(
        root: str, redis_server: Any) -> None:
    """"corrupt tensorstream manifest at 'man'": rm failed at the lookup, and so did every
    later write's look at what it replaces. Its manifest and its persistent chunks go;
    a write's staged chunk (with its expiry) and the keys beside it stay."""
    with redis_server.client(db=DB) as c:
        c.set(f"man:{GEN}:0", b"c" * 1000)
        c.set(f"man:{GEN}:1000", b"c" * 5)
        c.set(f"man:{OTHER_GEN}:0", b"staged by a write in progress", px=600_000)
        c.set("man:v:1", b"an object of its own")  # K:... not named like a chunk
        c.set("man2", b"another object")
        c.hset("mine", mapping={"owner": "the user"})  # a hash that is no manifest of ours
    r = cli("rm", "--dryrun", redis_server.url("man", db=DB))  # it failed at stat
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(dryrun) delete: " + redis_server.url("man", db=DB), r.stdout
    with redis_server.client(db=DB) as c:
        assert c.exists("man", f"man:{GEN}:0") == 2
    r = cli("rm", "--dryrun", redis_server.url("mine", db=DB))  # not ours: said so
    assert r.returncode != 0 and "not a tensorstream manifest" in r.stderr, r.stderr
    r = cli("rm", redis_server.url("man", db=DB))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("delete: " + redis_server.url("man", db=DB)), r.stdout
    assert "deleted the damaged object 'man'" in r.stderr, r.stderr
    assert "its manifest and 2 key(s)" in r.stderr, r.stderr
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys("man*")) == [
            b"man2", f"man:{OTHER_GEN}:0".encode(), b"man:v:1"]
    r = cli("rm", redis_server.url("man", db=DB))  # gone: what rm says of any missing object
    assert r.returncode != 0 and "no such" in r.stderr.lower(), r.stderr
    r = cli("rm", redis_server.url("mine", db=DB))  # never ours to delete
    assert r.returncode != 0 and "not a tensorstream manifest" in r.stderr, r.stderr
    with redis_server.client(db=DB) as c:
        assert c.hgetall("mine") == {b"owner": b"the user"}


def test_rm_of_a_corrupt_manifest_leaves_the_chunks_a_write_is_publishing(
        root: str, redis_server: Any) -> None:
    """A write over the damaged 'man' makes its chunks persistent, then publishes its
    manifest: an rm between the two deleted those chunks as the damaged object's, and
    the write then published an object whose bytes were gone. Only the damaged
    manifest's own generation goes; the others go with an rm once 'man' is gone."""
    with redis_server.client(db=DB) as c:
        c.set(f"man:{GEN}:0", b"c" * 1000)
        c.set(f"man:{OTHER_GEN}:0", b"new")  # made persistent, not yet published
    r = cli("rm", redis_server.url("man", db=DB))
    assert r.returncode == 0, r.stderr
    assert "its manifest and 1 key(s); 1 persistent chunk(s) of another generation left" \
        in r.stderr, r.stderr
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys("man*")) == [f"man:{OTHER_GEN}:0".encode()]
        c.hset("man", mapping={"tensorstream": "1", "size": "3", "chunk_size": "1000",
                               "generation": OTHER_GEN, "mtime": "1.0"})  # the publish
    r = cli("cat", redis_server.url("man", db=DB))
    assert r.returncode == 0 and r.stdout == "new", r.stderr
    # The neighbour: a damaged manifest with a dead write's chunks beside it.
    with redis_server.client(db=DB) as c:
        c.hset("man", mapping={"size": "-5", "generation": GEN})
    assert cli("rm", redis_server.url("man", db=DB)).returncode == 0
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys("man*")) == [f"man:{OTHER_GEN}:0".encode()]
    r = cli("rm", redis_server.url("man", db=DB))
    assert r.returncode == 0, r.stderr
    with redis_server.client(db=DB) as c:
        assert c.keys("man*") == []


def test_rm_of_a_to_redis_prefix_with_a_gap_deletes_its_keys_only(
        root: str, redis_server: Any) -> None:
    with redis_server.client(db=DB) as c:
        c.set("tz:notes", b"an object of its own")  # no offset: not a to_redis key
        c.set("tz:sub:header:0", b"H")  # a to_redis prefix of its own under tz:
        c.set("tz:sub:w:1", b"w")
        c.set("tz2:header:0", b"H")  # a prefix beside it
        c.hset("tz:m", mapping={"tensorstream": "1", "size": "3", "chunk_size": "1000",
                                "generation": GEN, "mtime": "1.0"})  # a manifest under tz:
        c.set(f"tz:m:{GEN}:0", b"abc")
    r = cli("rm", redis_server.url("tz", db=DB))
    assert r.returncode == 0, r.stderr
    assert "deleted the damaged object 'tz' (keys under 'tz':* are not one contiguous" \
        in r.stderr and ": 2 key(s)" in r.stderr, r.stderr
    with redis_server.client(db=DB) as c:
        assert sorted(c.keys("tz*")) == [
            b"tz2:header:0", b"tz:m", f"tz:m:{GEN}:0".encode(), b"tz:notes",
            b"tz:sub:header:0", b"tz:sub:w:1"]
    r = cli("cat", redis_server.url("tz:m", db=DB))
    assert r.returncode == 0 and r.stdout == "abc", r.stderr
