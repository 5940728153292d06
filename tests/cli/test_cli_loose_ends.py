"""The CLI's loose ends (round 2): a missing destination bucket said once, ``//`` in a
destination folder, error lines' names escaped as copy lines'. The real CLI in a
subprocess against local files and moto."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_env import cli, s3_env
from iam_users import iam_user_keys

S3_BUCKET = "tensorstream-tests"


def tree(root: Path, n: int) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"{i}.bin").write_bytes(b"x" * 1000)
    return root


def test_a_missing_destination_bucket_is_one_error_line_and_every_object_failed(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp -r`` of a tree into a bucket that does not exist printed the same error once per
    object (thousands of lines for a big tree); it is said once, for the bucket, and each
    object is still counted failed (``--json``: a failed line each, one error)."""
    src = tree(tmp_path / "src", 5)
    env = s3_env(moto_s3, tmp_path)
    for flags in ([], ["--dryrun"], ["--only-show-errors"]):
        r = cli("cp", "-r", *flags, "--endpoint-url", moto_s3.endpoint_url, str(src),
                "s3://no-such-bucket-here/p/", env=env)
        assert r.returncode == 1 and r.stdout == "", (flags, r)
        errors = [line for line in r.stderr.splitlines() if "error:" in line]
        assert errors == [
            "tensorstream: error: s3://no-such-bucket-here/: bucket 'no-such-bucket-here' "
            f"does not exist at {moto_s3.endpoint_url} (create it first; 'tensorstream ls "
            "s3://' lists the buckets these credentials see)"], (flags, r.stderr)
        if not flags:
            assert r.stderr.splitlines()[-1] == "5 failed"
    r = cli("cp", "-r", "--json", "--endpoint-url", moto_s3.endpoint_url, str(src),
            "s3://no-such-bucket-here/p/", env=env)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(o["status"], o["dst"]) for o in lines[:-1]] == [
        ("failed", f"s3://no-such-bucket-here/p/{i}.bin") for i in range(5)]
    assert {o["error"] for o in lines[:-1]} == set(lines[-1]["errors"])
    assert len(lines[-1]["errors"]) == 1 and lines[-1]["summary"] == "5 failed"
    assert r.stderr.count("does not exist") == 1
    # The neighbours: one object, and sync, say it once too; a bucket that exists copies.
    r = cli("cp", "--endpoint-url", moto_s3.endpoint_url, str(src / "0.bin"),
            "s3://no-such-bucket-here/p/", env=env)
    assert r.returncode == 1 and r.stderr.count("does not exist") == 1
    assert r.stderr.startswith("tensorstream: error: s3://no-such-bucket-here/: bucket")
    r = cli("sync", "--endpoint-url", moto_s3.endpoint_url, str(src),
            "s3://no-such-bucket-here/p/", env=env)
    assert r.returncode == 1 and r.stderr.count("does not exist") == 1, r.stderr
    r = cli("cp", "-r", "--endpoint-url", moto_s3.endpoint_url, str(src),
            f"s3://{S3_BUCKET}/bucket-there/", env=env)
    assert r.returncode == 0 and r.stdout.count("copy: ") == 5, r.stderr


def _keys(moto_s3: Any, prefix: str) -> list[str]:
    listed = moto_s3.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_a_double_slash_in_a_destination_folder_is_kept_as_aws_keeps_it(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp a s3://b/d//`` kept the key ``d//a`` (as aws does) but ``cp -r src/ s3://b/d//``
    collapsed it to ``d/a``; ``aws s3 cp --recursive`` keeps it (checked against moto:
    ``d//0.bin``). Both keep it now, and ``sync --delete`` into it deletes only extras there."""
    src = tree(tmp_path / "src", 2)
    env = s3_env(moto_s3, tmp_path)
    run = ("--endpoint-url", moto_s3.endpoint_url)
    base = f"s3://{S3_BUCKET}"
    assert cli("cp", *run, str(src / "0.bin"), f"{base}/one//", env=env).returncode == 0
    assert _keys(moto_s3, "one/") == ["one//0.bin"]
    r = cli("cp", "-r", *run, f"{src}/", f"{base}/dd//", env=env)
    assert r.returncode == 0, r.stderr
    assert _keys(moto_s3, "dd/") == ["dd//0.bin", "dd//1.bin"]
    assert f"-> {base}/dd//0.bin" in r.stdout
    # The neighbours: one slash, none, and a '//' in the middle.
    for dest, want in (("s1/", "s1/"), ("s0", "s0/"), ("m//n/", "m//n/")):
        r = cli("cp", "-r", *run, str(src), f"{base}/{dest}", env=env)
        assert r.returncode == 0, r.stderr
        assert _keys(moto_s3, dest.split("/")[0] + "/") == [f"{want}0.bin", f"{want}1.bin"]
    # sync --delete into d//: what it copied stays, an extra under d// goes, d/x stays.
    moto_s3.put(S3_BUCKET, "sd//old.bin", b"old")
    moto_s3.put(S3_BUCKET, "sd/keep.bin", b"other")
    r = cli("sync", "--delete", *run, str(src), f"{base}/sd//", env=env)
    assert r.returncode == 0, r.stderr
    assert _keys(moto_s3, "sd/") == ["sd//0.bin", "sd//1.bin", "sd/keep.bin"]
    assert r.stdout.count("delete: ") == 1 and "sd//old.bin" in r.stdout
    r = cli("sync", "--delete", *run, str(src), f"{base}/sd//", env=env)
    assert r.returncode == 0 and r.stdout == "", r
    # A prefix into itself with a '/' more (its copies dd//a are under dd/, and the next run
    # listed them as '/a', refused) is refused, as it was while '//' was dropped (then the
    # same objects); the keys above are left as they are.
    for argv in (["cp", "-r"], ["sync"], ["sync", "--delete"]):
        r = cli(*argv, *run, f"{base}/s1/", f"{base}/s1//", env=env)
        assert r.returncode in (1, 2) and "itself" in r.stderr, (argv, r)  # (--delete: 2)
    r = cli("cp", *run, f"{base}/s1/*", f"{base}/s1//", env=env)
    assert r.returncode == 1 and "into itself" in r.stderr, r
    assert _keys(moto_s3, "s1/") == ["s1/0.bin", "s1/1.bin"]


def test_an_error_line_names_its_object_escaped_as_the_copy_lines_do(
        tmp_path: Path, moto_s3: Any) -> None:
    """The ``NAME:`` that opens an error line printed a backslash in the name as it is
    (``esc/back\\tslash.bin: refused``, as a key holding a tab prints), where ``cp``'s and
    ``ls``' lines double it since fc86755. It is doubled there too now; the prose after it is
    escaped as before, and ``--json`` keeps the name exact."""
    env = s3_env(moto_s3, tmp_path)
    ep = ("--endpoint-url", moto_s3.endpoint_url)
    for name in ("back\\tslash.bin", "a\ttab.bin", "plain.bin"):
        moto_s3.put(S3_BUCKET, f"esc-err/{name}", b"x")
    # Into a directory, a backslash and a tab are refused by name (a path separator
    # elsewhere; a control character); the plain name is copied.
    r = cli("cp", "-r", *ep, f"s3://{S3_BUCKET}/esc-err/", str(tmp_path / "out"), env=env)
    assert r.returncode == 3, r
    errors = sorted(line for line in r.stderr.splitlines() if "error:" in line)
    assert [line.split(": refused")[0] for line in errors] == [
        f"tensorstream: error: s3://{S3_BUCKET}/esc-err/a\\ttab.bin",
        f"tensorstream: error: s3://{S3_BUCKET}/esc-err/back\\\\tslash.bin"], errors
    r = cli("cp", "-r", "--json", *ep, f"s3://{S3_BUCKET}/esc-err/", str(tmp_path / "o2"),
            env=env)
    failed = {json.loads(x)["src"] for x in r.stdout.splitlines()[:-1]
              if json.loads(x)["status"] == "failed"}
    assert failed == {f"s3://{S3_BUCKET}/esc-err/{n}" for n in ("back\\tslash.bin", "a\ttab.bin")}
    # A copy that fails while copying (a key that may not write): `SRC -> DST: ...`.
    src = tmp_path / "src"
    src.mkdir()
    (src / "x\\y.bin").write_bytes(b"x")
    keys = iam_user_keys(moto_s3, "reader", [{"Effect": "Allow", "Action": [
        "s3:ListBucket", "s3:GetObject"], "Resource": "*"}])
    env.update(AWS_ACCESS_KEY_ID=keys["s3_access_key_id"],
               AWS_SECRET_ACCESS_KEY=keys["s3_secret_access_key"])
    r = cli("cp", "-r", *ep, str(src), f"s3://{S3_BUCKET}/esc-ro/", env=env)
    assert r.returncode == 1, r
    assert r.stderr.startswith(f"tensorstream: error: {src}/x\\\\y.bin -> "
                               f"s3://{S3_BUCKET}/esc-ro/x\\\\y.bin: "), r.stderr
    assert "AccessDenied" in r.stderr


def test_a_local_path_typed_relative_prints_absolute_in_lines_and_json(tmp_path: Path) -> None:
    """What docs/cli.md says for aws users: ``cp``'s and ``--dryrun``'s lines name a local
    file by its absolute path (aws prints it relative to the current directory), the same
    path as ``--json``'s ``src``/``dst``, however it was typed."""
    (tmp_path / "work" / "src" / "sub").mkdir(parents=True)
    (tmp_path / "work" / "src" / "sub" / "b").write_bytes(b"b")
    here = tmp_path / "work"
    for flags in (["--dryrun"], []):
        r = subprocess.run([sys.executable, "-m", "tensorstream", "cp", "-r", *flags, "src/",
                            "../out/"], capture_output=True, text=True, timeout=120, cwd=here)
        assert r.returncode == 0, r.stderr
        line = f"copy: {here}/src/sub/b -> {tmp_path}/out/sub/b"
        assert r.stdout == (f"(dryrun) {line}\n" if flags else f"{line}\n")
    r = subprocess.run([sys.executable, "-m", "tensorstream", "cp", "--json", "./src/sub/b",
                        "../out/c"], capture_output=True, text=True, timeout=120, cwd=here)
    first = json.loads(r.stdout.splitlines()[0])
    assert (first["src"], first["dst"]) == (f"{here}/src/sub/b", f"{tmp_path}/out/c")


def test_a_prefix_into_its_own_double_slash_folder_names_no_exclude_that_is_refused(
        tmp_path: Path, moto_s3: Any) -> None:
    """``cp -r s3://b/p/ s3://b/p//x/`` (its copies ``p//x/a`` are under ``p/``) is refused
    as a copy into itself, and it said to leave DST out with ``--exclude '/x/*'``, which
    is itself refused (no pattern starts with '/'): advice that cannot be followed. No key
    under SRC that starts with '/' can be left out, so only a place outside SRC is named;
    the neighbour, ``p/x/``, still names its ``--exclude 'x/*'``, which copies."""
    src = tree(tmp_path / "src", 2)
    env = s3_env(moto_s3, tmp_path)
    run = ("--endpoint-url", moto_s3.endpoint_url)
    base = f"s3://{S3_BUCKET}"
    assert cli("cp", "-r", *run, f"{src}/", f"{base}/q/", env=env).returncode == 0
    for dest in ("q//x/", "q/x//y/"):
        r = cli("cp", "-r", *run, f"{base}/q/", f"{base}/{dest}", env=env)
        assert r.returncode == 1 and "into itself" in r.stderr, r.stderr
        assert "--exclude" not in r.stderr and "outside SRC" in r.stderr, r.stderr
    r = cli("cp", "-r", *run, f"{base}/q/", f"{base}/q/x/", env=env)
    assert r.returncode == 1 and "--exclude 'x/*'" in r.stderr, r.stderr
    r = cli("cp", "-r", *run, "--exclude", "x/*", f"{base}/q/", f"{base}/q/x/", env=env)
    assert r.returncode == 0, r.stderr
    assert _keys(moto_s3, "q") == ["q/0.bin", "q/1.bin", "q/x/0.bin", "q/x/1.bin"]
