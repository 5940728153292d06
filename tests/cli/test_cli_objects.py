"""``tensorstream stat | cat | rm`` (cli/objects.py) as operators script them: refusals,
ranges, ``--json`` for every outcome; the real CLI in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from cli_env import cli, s3_env
from tensorstream.testing.proxy import HTTPFaultProxy

S3_BUCKET = "tensorstream-tests"


def test_rm_r_of_the_root_directory_is_refused() -> None:
    # GNU rm's --preserve-root: every file on the machine is never what was meant.
    for target in ("/", "file:///", "//", "/tmp/..", "/."):
        r = cli("rm", "-r", "--dryrun", target)
        assert r.returncode == 2, (target, r.stderr[-300:])
        assert r.stdout == "" and "refusing" in r.stderr and "Traceback" not in r.stderr


def test_cat_range_that_is_empty_or_backwards_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "ten.bin"
    f.write_bytes(b"0123456789")
    for bad in ("3-2", "-0"):  # no bytes at all: HTTP answers 416, not an empty 206
        r = cli("cat", "--range", bad, str(f))
        assert r.returncode == 2 and r.stdout == "", (bad, r.stderr)
        assert "--range" in r.stderr
    for good, want in (("3-3", "3"), ("0-0", "0"), ("9-", "9"), ("-10", "0123456789"),
                       ("-99", "0123456789"), ("8-99", "89")):
        r = cli("cat", "--range", good, str(f))
        assert (r.returncode, r.stdout) == (0, want), (good, r.stderr)


def test_rm_json_reports_a_failed_delete_of_one_object(tmp_path: Path) -> None:
    # As rm -r --json does for each object that fails: one line saying so, on stdout.
    r = cli("rm", "--json", str(tmp_path / "missing.bin"))
    assert r.returncode == 1 and "no such file" in r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 1 and lines[0]["op"] == "delete" and lines[0]["status"] == "failed"
    assert lines[0]["uri"] == str(tmp_path / "missing.bin") and "no such file" in lines[0]["error"]
    (tmp_path / "there.bin").write_bytes(b"x")
    r = cli("rm", "--json", str(tmp_path / "there.bin"))
    assert r.returncode == 0 and [json.loads(line) for line in r.stdout.splitlines()] == [
        {"op": "delete", "status": "deleted", "uri": str(tmp_path / "there.bin")}]


def test_rm_r_deletes_several_objects_at_once_and_reports_them_in_order(
        tmp_path: Path, moto_s3: Any) -> None:
    # One HEAD + DELETE after the other took ~20 ms an object on loopback (10,000 keys:
    # minutes); over a real link each round trip is longer. aws s3 rm runs 10 at once.
    keys = [f"rmwide/{i:03d}.bin" for i in range(24)]
    for key in keys:
        moto_s3.put(S3_BUCKET, key, b"x")
    moto_s3.put(S3_BUCKET, "rmwide-kept.bin", b"x")
    in_flight, most = 0, 0

    async def slow_delete(method: str, path: str) -> None:
        nonlocal in_flight, most
        if method != "DELETE":
            return
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.2)
        in_flight -= 1

    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        proxy.faults.before_forward = slow_delete
        r = cli("rm", "-r", "--endpoint-url", proxy.url, f"s3://{S3_BUCKET}/rmwide/",
                env=s3_env(moto_s3, tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"delete: s3://{S3_BUCKET}/{k}" for k in keys]
    assert most > 1
    listed = moto_s3.client.list_objects_v2(Bucket=S3_BUCKET, Prefix="rmwide")
    assert [o["Key"] for o in listed.get("Contents", [])] == ["rmwide-kept.bin"]


def test_rm_r_of_a_whole_redis_database_deletes_what_ls_r_lists(redis_server: Any) -> None:
    db = redis_server.url("", db=11)  # a database of this test's own
    for key in ("a/x.bin", "b.bin"):
        r = cli("cp", "-q", "-", redis_server.url(key, db=11), input="x")
        assert r.returncode == 0, r.stderr
    assert cli("ls", "-r", db).stdout.splitlines() == ["a/x.bin", "b.bin"]
    r = cli("rm", "-r", db)  # it said "no objects under" what ls -r had just listed
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"delete: {redis_server.url(k, db=11)}"
                                     for k in ("a/x.bin", "b.bin")]
    r = cli("ls", "-r", db)  # empty now: nothing listed (exit 0, as for an empty bucket)
    assert (r.returncode, r.stdout) == (0, ""), r.stderr


def test_rm_r_of_an_object_deletes_it_and_only_it(tmp_path: Path, moto_s3: Any) -> None:
    # GNU rm -r FILE deletes FILE; tensorstream said "no objects under" it (exit 1).
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    (tmp_path / "model.bin2").write_bytes(b"x")
    r = cli("rm", "-r", str(f))
    assert r.returncode == 0 and r.stdout.splitlines() == [f"delete: {f}"], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin2"]
    r = cli("rm", "-r", "--exclude", "*.bin2", str(tmp_path / "model.bin2"))
    assert r.returncode == 1 and (tmp_path / "model.bin2").exists()  # excluded: kept
    # S3: the object NAME and what is under NAME/, never NAME-other (a prefix match).
    for key in ("rmr/p", "rmr/p/x.bin", "rmr/px.bin"):
        moto_s3.put(S3_BUCKET, key, b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("rm", "-r", *ep, f"s3://{S3_BUCKET}/rmr/p", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"delete: s3://{S3_BUCKET}/rmr/p",
                                     f"delete: s3://{S3_BUCKET}/rmr/p/x.bin"]
    listed = moto_s3.client.list_objects_v2(Bucket=S3_BUCKET, Prefix="rmr/")
    assert [o["Key"] for o in listed.get("Contents", [])] == ["rmr/px.bin"]
    r = cli("rm", "-r", *ep, "--dryrun", f"s3://{S3_BUCKET}/rmr/", env=env)
    assert r.stdout.splitlines() == [f"(dryrun) delete: s3://{S3_BUCKET}/rmr/px.bin"]


def test_rm_of_a_prefix_or_directory_without_r_says_add_r_and_deletes_nothing(
        tmp_path: Path, moto_s3: Any) -> None:
    # It said "no such object (404)" for a prefix, as if nothing were there.
    moto_s3.put(S3_BUCKET, "rmpre/a.bin", b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    for uri in (f"s3://{S3_BUCKET}/rmpre/", f"s3://{S3_BUCKET}/rmpre"):
        r = cli("rm", *ep, uri, env=env)
        assert r.returncode == 1 and r.stdout == "", r.stdout
        assert f"{uri} is a prefix, not an object; add -r" in r.stderr, r.stderr
    r = cli("rm", *ep, f"s3://{S3_BUCKET}/rmpre/nothing", env=env)
    assert r.returncode == 1 and "no such object" in r.stderr and "add -r" not in r.stderr
    assert moto_s3.client.get_object(Bucket=S3_BUCKET, Key="rmpre/a.bin")["Body"].read() == b"x"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    r = cli("rm", str(tmp_path / "d"))
    assert r.returncode == 1 and "is a directory" in r.stderr and "add -r" in r.stderr
    assert (tmp_path / "d" / "f").exists()


def test_a_redis_path_of_digits_is_a_database_for_redis_py_and_refused_here(
        redis_server: Any, tmp_path: Path) -> None:
    """redis://host:6379/4711 is database 4711 to redis-py's from_url and redis-cli -u:
    tensorstream read and wrote the key "4711" of database 0 instead. Refused, naming both
    spellings; a key made of digits still copies (its URIs spell it unambiguously)."""
    raw = f"redis://{redis_server.host}:{redis_server.port}"  # (url() spells digits as a key)
    r = cli("cp", "-", f"{raw}/4711", input="x")
    assert r.returncode == 2, r.stderr
    assert "the path /4711 is the database number for redis-py" in r.stderr, r.stderr
    with redis_server.client() as c:
        assert not c.exists("4711")
    assert cli("ls", f"{raw}/4712/").returncode == 2
    # the key itself, said either way
    r = cli("cp", "-", redis_server.url("4711?db=0"), input="written as 4711?db=0")
    assert r.returncode == 0, r.stderr
    r = cli("cat", redis_server.url("%34711"))  # %34 is "4"
    assert r.returncode == 0 and r.stdout == "written as 4711?db=0", r.stderr
    # a folder whose file is named with digits only, copied to the root of a database of
    # this test's own (other tests leave keys at database 0's root, some broken on purpose)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "4713").write_bytes(b"digits")
    try:
        r = cli("cp", "-r", str(tmp_path / "up") + "/", redis_server.url("", db=12))
        assert r.returncode == 0, r.stderr
        with redis_server.client(db=12) as c:
            assert c.exists("4713")
        r = cli("cp", "-r", "--exclude", "*", "--include", "4713", redis_server.url("", db=12),
                str(tmp_path / "down") + "/")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "down" / "4713").read_bytes() == b"digits"
    finally:
        with redis_server.client() as c:
            c.delete("4711")
        with redis_server.client(db=12) as c:
            c.delete("4713")


def test_rm_r_takes_an_s3_keys_slashes_as_they_are_as_ls_does(
        tmp_path: Path, moto_s3: Any) -> None:
    # `rm -r s3://b//` deleted the whole bucket and `rm -r s3://b/p//` everything under
    # p/, while `ls -r` of the same URIs listed nothing: S3 keys' slashes are their own
    # (aws s3 rm lists the prefix as typed); only a local path's collapse.
    for key in ("rmdbl/p/a.bin", "rmdbl/p//b.bin", "rmdbl/pp.bin"):
        moto_s3.put(S3_BUCKET, key, b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("rm", "-r", "--dryrun", *ep, f"s3://{S3_BUCKET}//", env=env)  # (dryrun: a
    assert r.returncode == 1 and r.stdout == "", r.stdout[:300]  # shared bucket)
    assert "no objects under" in r.stderr, r.stderr
    r = cli("rm", "-r", *ep, f"s3://{S3_BUCKET}/rmdbl/p//", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"delete: s3://{S3_BUCKET}/rmdbl/p//b.bin"]
    listed = moto_s3.client.list_objects_v2(Bucket=S3_BUCKET, Prefix="rmdbl/")
    assert [o["Key"] for o in listed.get("Contents", [])] == ["rmdbl/p/a.bin", "rmdbl/pp.bin"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    r = cli("rm", "-r", f"{tmp_path}/d//")  # a local path: d// is d/
    assert r.returncode == 0 and not (tmp_path / "d" / "f").exists(), r.stderr


def test_credentials_escapes_a_profile_name_and_a_config_path(isolated_env: Path) -> None:
    # Printed raw: a shared config's profile named with terminal escape sequences, or a
    # path holding one or a line break, repainted the screen or faked a line of the table.
    folder = isolated_env / "cf\x1b[31m\nX"
    folder.mkdir()
    (folder / "config").write_text("[profile p\x1b[2Jq]\nregion = us-east-1\n"
                                   "aws_access_key_id = AKIAEXAMPLEEXAMPLE12\n"
                                   "aws_secret_access_key = " + "s" * 40 + "\n")
    env = {**os.environ, "AWS_CONFIG_FILE": str(folder / "config"),
           "AWS_PROFILE": "p\x1b[2Jq"}
    r = cli("credentials", "s3://bucket/model.tensors", env=env)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "s" * 40 not in r.stdout
    assert "profile p\\x1b[2Jq" in r.stdout and "cf\\x1b[31m\\nX/config" in r.stdout
    assert len(r.stdout.splitlines()) == 8, r.stdout  # the title and 7 values, one a line
    r = cli("credentials", "--json", "s3://bucket/model.tensors", env=env)  # exact there
    assert json.loads(r.stdout)["profile"]["value"] == "p\x1b[2Jq"


def test_stat_shows_a_name_as_ls_does_backslashes_doubled(tmp_path: Path) -> None:
    # A name with a backslash and "n" and one with a line break both printed as a\nb.
    (tmp_path / "a\\nb").write_bytes(b"1")
    (tmp_path / "a\nb").write_bytes(b"22")
    lines = [cli("stat", str(tmp_path / name)).stdout.splitlines()[0] for name in ("a\\nb", "a\nb")]
    assert lines == [f"uri:     {tmp_path}/a\\\\nb", f"uri:     {tmp_path}/a\\nb"]
    assert sorted(cli("ls", str(tmp_path)).stdout.splitlines()) == ["a\\\\nb", "a\\nb"]


def test_rm_of_one_object_keeps_it_when_the_rules_exclude_it(tmp_path: Path,
                                                              moto_s3: Any) -> None:
    # The rules were read only with -r or a pattern: `rm --exclude '*.pt' model.pt`
    # deleted the file it was told to keep (cp of one file, and aws s3 rm, apply them).
    f = tmp_path / "model.pt"
    f.write_bytes(b"x")
    for rules in (["--exclude", "*.pt"], ["--exclude", "*", "--include", "*.bin"]):
        r = cli("rm", *rules, str(f))
        assert r.returncode == 1 and r.stdout == "" and f.exists(), r.stderr
        assert "left out by the --exclude/--include rules" in r.stderr
    r = cli("rm", "--exclude", "*", "--include", "*.pt", str(f))  # taken back: deleted
    assert r.returncode == 0 and not f.exists(), r.stderr
    moto_s3.put(S3_BUCKET, "rmone/keep.pt", b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("rm", *ep, "--exclude", "keep.*", f"s3://{S3_BUCKET}/rmone/keep.pt", env=env)
    assert r.returncode == 1 and "left out" in r.stderr, r.stderr
    assert moto_s3.exists(S3_BUCKET, "rmone/keep.pt")


def test_rm_r_of_dot_or_dot_dot_is_refused_as_gnu_rm_refuses_it(tmp_path: Path) -> None:
    # `rm -r ..` (a typo for `rm -r ../x`) deleted every file under the parent.
    (tmp_path / "d").mkdir()
    (tmp_path / "f.bin").write_bytes(b"x")
    (tmp_path / "d" / "g.bin").write_bytes(b"x")
    for target in (".", "..", "./", "../", "e/..", f"file://{tmp_path}/d/.."):
        r = cli("rm", "-r", target, cwd=tmp_path / "d")
        assert r.returncode == 2 and r.stdout == "", (target, r.stdout)
        assert "refusing to delete '.' or '..'" in r.stderr, r.stderr
    assert (tmp_path / "f.bin").exists() and (tmp_path / "d" / "g.bin").exists()
    (tmp_path / "..x").write_bytes(b"x")  # a name that only starts with dots is a name
    r = cli("rm", "-r", "..x", cwd=tmp_path)
    assert r.returncode == 0 and not (tmp_path / "..x").exists(), r.stderr


def test_stat_and_cat_of_a_prefix_say_it_is_one_and_how_to_list_it(
        tmp_path: Path, moto_s3: Any) -> None:
    # They said only "no such object (404)", as for a typo, where rm said "a prefix".
    moto_s3.put(S3_BUCKET, "statpre/a.bin", b"x")
    moto_s3.put(S3_BUCKET, "statpre-other.bin", b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    uri = f"s3://{S3_BUCKET}/statpre"
    for command in (["stat"], ["stat", "--json"], ["cat"], ["cp", "-q"]):
        r = cli(*command, *ep, uri, *(["-"] if command[0] == "cp" else []), env=env)
        assert r.returncode == 1 and r.stdout == "", (command, r.stdout)
        assert (f"{uri} is a prefix, not an object; 'tensorstream ls {uri}/' lists the "
                "objects under it") in r.stderr, r.stderr
    r = cli("stat", *ep, f"s3://{S3_BUCKET}/statpre-nothing", env=env)  # a typo: as before
    assert r.returncode == 1 and "no such object" in r.stderr and "prefix, not" not in r.stderr


def test_rm_r_of_a_directory_deletes_its_links_never_what_they_point_to(tmp_path: Path) -> None:
    """A Hugging Face snapshot folder is all links into ``blobs/``: ``rm -r`` of it deleted
    nothing, without a word (exit 0), while ``ls`` listed its files. It deletes each link
    itself now (to a file, a directory, or nowhere), as GNU ``rm -r`` does, never a file
    a link points to; the rules apply to links as to files."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snap"
    (blobs / "d").mkdir(parents=True)
    (blobs / "x").write_bytes(b"weights")
    (blobs / "d" / "y").write_bytes(b"y")
    (snap / "sub").mkdir(parents=True)
    (snap / "model.bin").symlink_to(blobs / "x")
    (snap / "sub" / "cfg.json").symlink_to(blobs / "x")
    (snap / "dirlink").symlink_to(blobs / "d")
    (snap / "broken").symlink_to(tmp_path / "nowhere")
    (snap / "real.txt").write_bytes(b"r")
    r = cli("rm", "-r", "--dryrun", str(snap))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 5, r.stdout
    r = cli("rm", "-r", "--exclude", "sub/*", str(snap))
    assert r.returncode == 0, r.stderr
    for name in ("model.bin", "dirlink", "broken", "real.txt"):
        assert f"delete: {snap / name}" in r.stdout, (name, r.stdout)
        assert not os.path.lexists(snap / name), name
    assert (snap / "sub" / "cfg.json").is_symlink()  # left out by the rules
    assert (blobs / "x").read_bytes() == b"weights" and (blobs / "d" / "y").read_bytes() == b"y"
