"""``tensorstream ls`` (cli/ls.py) of large trees: what it reads before the first line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, s3_env
from tensorstream.testing.proxy import HTTPFaultProxy

S3_BUCKET = "tensorstream-tests"


def test_ls_of_a_directory_without_r_reads_only_that_directory(tmp_path: Path) -> None:
    # It walked the whole tree below before printing a line: `ls /` (every file of
    # the machine) never answered, and a link to / inside any folder did the same.
    d = tmp_path / "d"
    (d / "sub" / "deeper").mkdir(parents=True)
    (d / "sub" / "deeper" / "w.bin").write_bytes(b"x")
    (d / "empty").mkdir()
    (d / "a.bin").write_bytes(b"0123456789")
    (d / "link.bin").symlink_to(d / "a.bin")  # a link is listed as cp -r copies it
    (d / "broken.bin").symlink_to(d / "gone")
    (d / "all").symlink_to("/")
    (d / ".x.bin.tensorstream-partial.tmp").write_bytes(b"")  # our own temp file
    os.mkfifo(d / "fifo")
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", "-l", str(d)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[-1] for line in lines] == [
        "a.bin", "all/", "empty/", "link.bin", "sub/"]
    assert lines[0].split()[-2:] == ["10", "a.bin"] and lines[3].split()[-2:] == ["10", "link.bin"]
    assert lines[1].split() == ["PRE", "all/"]
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", "--json", str(d / "sub")],
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, '{"prefix": "deeper/"}\n'), r.stderr
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", str(d / "empty")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no objects at" in r.stderr
    # A path that is not there (a typo) says so; it said "no objects at", as for an
    # empty directory.
    for typo in (d / "emtpy", d / "emtpy" / ""):
        r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", str(typo)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and (
            f"no such file or directory: {d / 'emtpy'}" in r.stderr), r.stderr


def test_ls_of_an_s3_prefix_without_r_lists_one_level_by_delimiter(tmp_path: Path,
                                                                    moto_s3: Any) -> None:
    # Every key below was listed to print each deeper prefix once: a prefix of a
    # million keys took minutes before its first line. aws s3 ls asks with Delimiter=/.
    for key in ("lvl/a.bin", "lvl/sp ace/x.bin", "lvl/sp ace/y/z.bin", "lvl/p+q/r.bin",
                "lvl/m/", "lvl/m/n.bin", "lvl/zz.bin", "lvl2/no.bin"):
        moto_s3.put(S3_BUCKET, key, b"" if key.endswith("/") else b"0123456789")
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", "-l", "--endpoint-url",
                            proxy.url, f"s3://{S3_BUCKET}/lvl/"], capture_output=True,
                           text=True, timeout=60, env=s3_env(moto_s3, tmp_path))
        lists = [q.path for q in proxy.requests if q.method == "GET" and "list-type" in q.path]
    assert r.returncode == 0, r.stderr
    assert [line.split(None, 2)[-1] if "PRE" not in line else line.split(None, 1)[1]
            for line in r.stdout.splitlines()] == [
        "10 a.bin", "m/", "p+q/", "sp ace/", "10 zz.bin"]
    assert lists and all("delimiter=%2F" in q for q in lists)
    r = subprocess.run([sys.executable, "-m", "tensorstream", "ls", "-r", "--endpoint-url",
                        moto_s3.endpoint_url, f"s3://{S3_BUCKET}/lvl/"], capture_output=True,
                       text=True, timeout=60, env=s3_env(moto_s3, tmp_path))
    assert r.stdout.splitlines() == ["a.bin", "m/n.bin", "p+q/r.bin", "sp ace/x.bin",
                                     "sp ace/y/z.bin", "zz.bin"]


@pytest.mark.parametrize("command", [["ls"], ["stat"], ["cp"], ["cp", "-r"]])
def test_a_windows_path_is_said_to_be_one(command: list[str], tmp_path: Path) -> None:
    # Typed as on Windows, it names a file "C:\\models\\m.tensors" in the current directory:
    # the error says so and what to give instead, not only "no such file".
    r = subprocess.run([sys.executable, "-m", "tensorstream", *command, "C:\\models\\m.tensors",
                        *(["out/"] if command[0] == "cp" else [])],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 1 and "looks like a Windows path" in r.stderr, r.stderr


def test_ls_of_an_empty_bucket_exits_0_as_aws_s3_ls_does(tmp_path: Path, moto_s3: Any) -> None:
    # It said "no objects at" (exit 1), as for a bucket that is not there: a script's
    # `ls s3://b || create it` took an empty bucket for a missing one. aws s3 ls exits 1
    # only for a key or prefix that matches nothing.
    moto_s3.create_bucket("ts-empty-ls-40")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    for uri in ("s3://ts-empty-ls-40", "s3://ts-empty-ls-40/"):
        r = cli("ls", *ep, uri, env=env)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), (uri, r.stderr)
    r = cli("ls", *ep, "--summarize", "--json", "s3://ts-empty-ls-40/", env=env)
    assert r.returncode == 0 and json.loads(r.stdout) == {"total_objects": 0, "total_size": 0}
    for uri in ("s3://ts-empty-ls-40/nothing/", "s3://ts-no-such-bucket-40/"):
        r = cli("ls", *ep, uri, env=env)
        assert r.returncode == 1 and r.stderr, (uri, r.stderr)
