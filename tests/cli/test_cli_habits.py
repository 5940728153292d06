"""``tensorstream cp``/``rm``/``ls`` as aws s3 / s5cmd / rclone users type them: paths
and streams, storage options, destinations; the real CLI in a subprocess against local
files, moto and redis-server. (sync: test_cli_sync.py; patterns and wildcards:
test_cli_patterns.py; what it prints: test_cli_output.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, files_under, s3_env
from tensorstream.testing.s3_server import isolated_s3_env

S3_BUCKET = "tensorstream-tests"


def hf_snapshot(root: Path) -> Path:
    """A Hugging Face cache layout: snapshot files are symlinks into blobs/."""
    blobs = root / "blobs"
    snap = root / "snapshots" / "0123abc"
    (snap / "sub").mkdir(parents=True)
    blobs.mkdir()
    for name, data in [("aa11", b"config"), ("bb22", os.urandom(200_000)), ("cc33", b"tok")]:
        (blobs / name).write_bytes(data)
    (snap / "config.json").symlink_to("../../blobs/aa11")
    (snap / "model.safetensors").symlink_to("../../blobs/bb22")
    (snap / "sub" / "tokenizer.json").symlink_to("../../../blobs/cc33")
    return snap


# -- paths and streams --------------------------------------------------------------
def test_hugging_face_snapshot_is_copied_through_its_symlinks(tmp_path: Path) -> None:
    snap = hf_snapshot(tmp_path / "hub")
    r = cli("cp", "-r", str(snap), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    got = files_under(tmp_path / "out")
    assert got == {"config.json": b"config", "model.safetensors": (snap / "model.safetensors")
                   .read_bytes(), "sub/tokenizer.json": b"tok"}
    assert not any(p.is_symlink() for p in (tmp_path / "out").rglob("*"))
    assert r.stdout.count("copy: ") == 3
    assert r.stderr.startswith("copied 3 files (")


def test_ls_of_a_hugging_face_snapshot_shows_what_cp_copies(tmp_path: Path) -> None:
    """Every file of a snapshot is a link into blobs/, and `ls` listed regular files only:
    "no objects at ..." (exit 1) for the folder `cp -r` copies three files from."""
    snap = hf_snapshot(tmp_path / "hub")
    r = cli("ls", "-r", str(snap))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["config.json", "model.safetensors", "sub/tokenizer.json"]
    r = cli("ls", "--json", str(snap) + "/")
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x.get("key") or x.get("prefix") for x in lines] == [
        "config.json", "model.safetensors", "sub/"]
    assert lines[1]["size"] == (snap / "model.safetensors").stat().st_size
    r = cli("ls", "-l", str(snap / "config.json"))
    assert r.returncode == 0 and r.stdout.split()[-2:] == ["6", "config.json"], r.stderr


def test_no_follow_symlinks_reports_every_skipped_entry(tmp_path: Path) -> None:
    snap = hf_snapshot(tmp_path / "hub")
    (snap / "real.txt").write_bytes(b"real")
    r = cli("cp", "-r", "--no-follow-symlinks", str(snap), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr  # left out by choice: not a failure
    assert files_under(tmp_path / "out") == {"real.txt": b"real"}
    for name in ("config.json", "model.safetensors", "sub/tokenizer.json"):
        assert f"skipped {snap / name}: symbolic link (--no-follow-symlinks)" in r.stderr
    r = cli("cp", "-r", "--json", "--no-follow-symlinks", str(snap), str(tmp_path / "out2"))
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert sum(1 for x in lines if x.get("status") == "skipped") == 3
    assert len(lines[-1]["skipped"]) == 3


def test_broken_symlink_is_reported_and_exit_is_partial(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.bin").write_bytes(b"ok")
    (src / "gone.bin").symlink_to("nowhere")
    r = cli("cp", "-r", str(src), str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert f"skipped {src / 'gone.bin'}: broken symbolic link" in r.stderr
    assert files_under(tmp_path / "out") == {"ok.bin": b"ok"}


def test_dash_is_stdout_and_stdin(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    (tmp_path / "a.bin").write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "tensorstream", "cp", str(tmp_path / "a.bin"), "-"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == data
    assert not (tmp_path / "-").exists()
    r = subprocess.run([sys.executable, "-m", "tensorstream", "cp", "-", str(tmp_path / "b.bin")],
                       input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b.bin").read_bytes() == data
    assert r.stdout.decode() == f"copy: - -> {tmp_path / 'b.bin'}\n"


def test_dash_from_stdin_keeps_the_output_modes_and_makes_the_directories(
        tmp_path: Path) -> None:
    """``cp - DST``: ``--json`` ended without the summary object every ``cp --json`` ends
    with (none at all on failure), ``--json``/``--quiet --dryrun`` printed a plain text line,
    and a DST under missing directories failed where ``cp FILE DST`` makes them."""
    def run(*argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "tensorstream", "cp", *argv], input=b"abc",
                              capture_output=True, timeout=60)

    r = run("-", str(tmp_path / "new" / "dir" / "b.bin"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "new" / "dir" / "b.bin").read_bytes() == b"abc"
    r = run("--json", "-", str(tmp_path / "c.bin"))
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0 and [d["op"] for d in lines] == ["copy", "summary"]
    assert lines[0]["status"] == "copied" and lines[1]["files"] == 1 and lines[1]["bytes"] == 3
    r = run("--json", "--dryrun", "-", str(tmp_path / "d.bin"))
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0 and [d["status"] for d in lines[:1]] == ["dryrun"]
    assert lines[1]["op"] == "summary" and lines[1]["files"] == 0
    r = run("--quiet", "--dryrun", "-", str(tmp_path / "d.bin"))
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b""
    assert not (tmp_path / "d.bin").exists()
    (tmp_path / "file").write_bytes(b"in the way")
    r = run("--json", "-", str(tmp_path / "file" / "e.bin"))
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 1 and lines[0]["status"] == "failed"
    assert lines[1]["op"] == "summary" and len(lines[1]["errors"]) == 1
    assert "cannot be made: a file is in its way" in r.stderr.decode()
    assert (tmp_path / "file").read_bytes() == b"in the way"


def test_cp_onto_a_device_or_fifo_writes_into_it_and_keeps_it(tmp_path: Path) -> None:
    """``cp SRC /dev/null`` (as aws s3 cp): the bytes go into the device or FIFO in order;
    the rename of a temp file replaced the node itself (/dev/null, as root)."""
    import stat
    import threading

    data = os.urandom(3_000_000)
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "null").symlink_to("/dev/null")
    r = cli("cp", "--part-size", "1M", str(tmp_path / "a.bin"), str(tmp_path / "null"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"copy: {tmp_path / 'a.bin'} -> {tmp_path / 'null'}\n"
    assert os.readlink(tmp_path / "null") == "/dev/null"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = cli("cp", str(tmp_path / "a.bin"), str(fifo))  # nobody reads: said, not a hang
    assert r.returncode == 1 and "is a FIFO: no reader" in r.stderr
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    try:
        for _ in range(100):  # the reader's open has to come first
            r = cli("cp", "--json", str(tmp_path / "a.bin"), str(fifo))
            if r.returncode == 0:
                break
    finally:
        if not got:
            with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
                pass  # let a reader still waiting go
        reader.join(10)
    assert r.returncode == 0, r.stderr
    assert got == [data] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["op"] for d in lines] == ["copy", "summary"] and lines[1]["bytes"] == len(data)


def test_copy_onto_itself_is_refused(tmp_path: Path, moto_s3: Any) -> None:
    (tmp_path / "a.bin").write_bytes(b"original")
    before = os.stat(tmp_path / "a.bin").st_mtime_ns
    r = cli("cp", str(tmp_path / "a.bin"), str(tmp_path / "a.bin"))
    assert r.returncode == 1
    assert "refused: source and destination are the same object" in r.stderr
    assert os.stat(tmp_path / "a.bin").st_mtime_ns == before
    r = cli("cp", str(tmp_path / "a.bin"), str(tmp_path) + "/")  # same file, by directory
    assert r.returncode == 1 and "same object" in r.stderr
    moto_s3.put(S3_BUCKET, "self/x.bin", b"x")
    env = s3_env(moto_s3, tmp_path)
    uri = f"s3://{S3_BUCKET}/self/x.bin"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", uri, uri, env=env)
    assert r.returncode == 1 and "same object" in r.stderr
    assert "--metadata" in r.stderr  # how to change its metadata in place
    # With fields given it is aws s3 cp's in-place change (CopyObject onto itself, REPLACE).
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", uri, uri, "--content-type",
            "text/x-new", "--metadata", "k=v", env=env)
    assert r.returncode == 0 and "copied by S3" in r.stdout + r.stderr, r.stderr
    head = moto_s3.client.head_object(Bucket=S3_BUCKET, Key="self/x.bin")
    assert head["ContentType"] == "text/x-new" and head["Metadata"] == {"k": "v"}
    assert moto_s3.get(S3_BUCKET, "self/x.bin") == b"x"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "--no-server-side-copy", uri, uri,
            "--content-type", "text/y", env=env)
    assert r.returncode == 1 and "--no-server-side-copy" in r.stderr, r.stderr


def test_a_local_file_onto_itself_is_refused_whatever_the_side_options(tmp_path: Path) -> None:
    """``--src-endpoint-url``/``--dst-region`` (a script's fixed flags) made ``cp a a`` two
    endpoints' objects: the local file was rewritten from itself (a new inode, its hard links
    cut off). A local file has no endpoint."""
    (tmp_path / "a.bin").write_bytes(b"original")
    os.link(tmp_path / "a.bin", tmp_path / "hard.bin")
    before = os.stat(tmp_path / "a.bin")
    for flags in (["--src-endpoint-url", "http://127.0.0.1:1"], ["--dst-region", "eu-west-1"]):
        for dest in (str(tmp_path / "a.bin"), str(tmp_path) + "/", str(tmp_path / "hard.bin")):
            r = cli("cp", *flags, str(tmp_path / "a.bin"), dest)
            assert r.returncode == 1 and "same object" in r.stderr, r.stderr
    after = os.stat(tmp_path / "a.bin")
    assert (after.st_ino, after.st_mtime_ns, after.st_nlink) == (
        before.st_ino, before.st_mtime_ns, 2)


def test_sync_delete_from_an_http_url_deletes_nothing_and_says_why(tmp_path: Path) -> None:
    """A URL names one object: ``sync --delete`` copies it and deletes nothing, saying why
    (as for one S3 object), instead of failing with "http does not support list"."""
    from tensorstream.testing.http_server import HTTPTestServer

    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.bin").write_bytes(b"k")
    with HTTPTestServer() as server:
        server.put("d/m.bin", b"m")
        r = cli("sync", "--delete", server.url("d/m.bin"), str(tmp_path / "dst"))
    assert r.returncode == 3, r.stderr
    assert "is not a directory or prefix with objects under it, so nothing is deleted" \
        in r.stderr and "does not support list" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["keep.bin", "m.bin"]


def test_directory_or_prefix_without_r_says_add_r(tmp_path: Path, moto_s3: Any) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"x")
    r = cli("cp", str(tmp_path / "d"), str(tmp_path / "o"))
    assert r.returncode == 1 and "is a directory; add -r (--recursive)" in r.stderr
    moto_s3.put(S3_BUCKET, "pfx/inner/a.bin", b"a")
    r = cli("cp", "--endpoint-url", moto_s3.endpoint_url, f"s3://{S3_BUCKET}/pfx/inner",
            str(tmp_path / "o"), env=s3_env(moto_s3, tmp_path))
    assert r.returncode == 1, r.stderr
    assert "is a prefix, not an object; add -r (--recursive)" in r.stderr


# -- destinations, --resume, rm -------------------------------------------------------
def test_a_destination_naming_a_database_or_bucket_gets_the_name(
        tmp_path: Path, redis_server: Any, moto_s3: Any) -> None:
    """``cp FILE redis://host:port`` (no key) wrote the Redis key ``""``; like ``s3://bucket``
    it names where objects go, so the object keeps its name there. From stdin there is no
    name to keep: a usage error."""
    name = "dbroot-7f3a.bin"
    (tmp_path / name).write_bytes(b"x")
    root = redis_server.url().rstrip("/")
    env = s3_env(moto_s3, tmp_path)
    for dst in [root, f"s3://{S3_BUCKET}"]:
        r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", str(tmp_path / name), dst, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().endswith(f"{dst}/{name}")
        r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "-", dst, input="y", env=env)
        assert r.returncode == 2 and "needs DST to name the object" in r.stderr
    assert cli("cat", f"{root}/{name}").stdout == "x"
    with redis_server.client() as c:
        assert not c.exists("")
    assert moto_s3.get(S3_BUCKET, name) == b"x"


def test_cp_r_resume_skips_files_already_complete(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(os.urandom(30_000))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "f0.bin").write_bytes((src / "f0.bin").read_bytes())
    r = cli("cp", "-r", "--resume", "--json", str(src), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    status = {Path(x["src"]).name: x["status"] for x in lines[:-1]}
    assert status == {"f0.bin": "skipped", "f1.bin": "copied", "f2.bin": "copied"}
    assert files_under(tmp_path / "out") == files_under(src)


def test_rm_prints_what_it_removes_and_dryrun_removes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    for name in ("a.pt", "b.bin"):
        (d / name).write_bytes(b"x")
    r = cli("rm", "-r", "--dryrun", str(d))
    assert r.returncode == 0 and r.stdout.splitlines() == [
        f"(dryrun) delete: {d / 'a.pt'}", f"(dryrun) delete: {d / 'b.bin'}"]
    assert sorted(p.name for p in d.iterdir()) == ["a.pt", "b.bin"]
    r = cli("rm", "-r", "--exclude", "*.bin", str(d))
    assert r.returncode == 0 and r.stdout.splitlines() == [f"delete: {d / 'a.pt'}"]
    assert [p.name for p in d.iterdir()] == ["b.bin"]


# -- habits -----------------------------------------------------------------------------
def test_storage_options_before_or_after_and_aws_names(tmp_path: Path, moto_s3: Any) -> None:
    env = s3_env(moto_s3, tmp_path)
    moto_s3.put(S3_BUCKET, "habits/m.bin", b"weights")
    uri = f"s3://{S3_BUCKET}/habits/m.bin"
    for argv in (["--endpoint-url", moto_s3.endpoint_url, "cp", uri, str(tmp_path / "a")],
                 ["cp", uri, str(tmp_path / "b"), "--endpoint-url", moto_s3.endpoint_url],
                 ["--region", moto_s3.region, "cp", "--s3-endpoint", moto_s3.endpoint_url, uri,
                  str(tmp_path / "c")]):
        r = cli(*argv, env=env)
        assert r.returncode == 0, (argv, r.stderr)
    assert {p.name for p in tmp_path.iterdir()} >= {"a", "b", "c"}


def test_endpoint_without_scheme_is_a_usage_error(tmp_path: Path) -> None:
    r = cli("cp", "--endpoint-url", "minio:9000", "s3://b/k", str(tmp_path / "x"))
    assert r.returncode == 2
    assert ("--endpoint-url 'minio:9000' has no scheme; write it as http://minio:9000 "
            "(plain text) or https://minio:9000 (TLS)") in r.stderr
    assert "ca_bundle" not in r.stderr and "certificate" not in r.stderr


def test_s3_endpoint_without_scheme_means_https_as_in_tensorizer(
        tmp_path: Path, moto_s3_tls: Any) -> None:
    """``--s3-endpoint host:port`` (tensorizer's and vLLM's name) was refused for its missing
    scheme while ``s3_endpoint="host:port"`` means https://; the flag now means what the
    option means (``--endpoint-url``, aws's name, still refuses one, as the aws CLI does)."""
    moto_s3_tls.put(S3_BUCKET, "habits/tls.bin", b"over https")
    env = s3_env(moto_s3_tls, tmp_path)
    hostport = moto_s3_tls.endpoint_url.removeprefix("https://")
    uri = f"s3://{S3_BUCKET}/habits/tls.bin"
    r = cli("cp", "--s3-endpoint", hostport, "--ca-bundle", moto_s3_tls.ca_bundle_path, uri,
            str(tmp_path / "a"), env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a").read_bytes() == b"over https"
    r = cli("cp", "--endpoint-url", hostport, uri, str(tmp_path / "b"), env=env)
    assert r.returncode == 2 and f"--endpoint-url {hostport!r} has no scheme" in r.stderr
    assert not (tmp_path / "b").exists()


def test_s3_endpoint_and_endpoint_url_together_are_a_usage_error(tmp_path: Path) -> None:
    r = cli("ls", "--endpoint-url", "http://127.0.0.1:9", "--s3-endpoint", "127.0.0.1:9",
            "s3://b/")
    assert r.returncode == 2
    assert ("--endpoint-url and --s3-endpoint both name the S3 endpoint; give one") in r.stderr


def test_s3_endpoint_without_scheme_to_a_plain_text_server_says_use_http(
        tmp_path: Path, moto_s3: Any) -> None:
    """The https:// that ``--s3-endpoint host:port`` means, sent to a plain-text server, is
    told apart from a certificate problem and says to write http://."""
    hostport = moto_s3.endpoint_url.removeprefix("http://")
    r = cli("ls", "--s3-endpoint", hostport, "--retries", "1", f"s3://{S3_BUCKET}/",
            env=s3_env(moto_s3, tmp_path))
    assert r.returncode != 0
    assert "answered in plain text, not TLS: use an http:// endpoint" in r.stderr, r.stderr
    assert f"https://{hostport} answered in plain text" in r.stderr, r.stderr



@pytest.mark.parametrize("name", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_aws_endpoint_variable_without_scheme_is_a_usage_error_too(
        tmp_path: Path, name: str) -> None:
    """``--endpoint-url 127.0.0.1:9`` was refused (exit 2) but ``AWS_ENDPOINT_URL=127.0.0.1:9``
    was taken as https://127.0.0.1:9 and the command failed reaching it; the aws CLI refuses
    both. It is now a usage error naming the variable, before any connection."""
    env = {**os.environ, **isolated_s3_env(tmp_path), name: "127.0.0.1:9",
           "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    r = cli("ls", "s3://b/", env=env)  # (cli: 120 s at most)
    assert r.returncode == 2, r.stderr
    assert (f"env {name} '127.0.0.1:9' has no scheme; write it as http://127.0.0.1:9 "
            "(plain text) or https://127.0.0.1:9 (TLS)") in r.stderr


def test_two_s3_endpoints_in_one_command(tmp_path: Path, moto_s3: Any,
                                         moto_s3_public: Any) -> None:
    data = os.urandom(300_000)
    moto_s3_public.client.put_object(Bucket=S3_BUCKET, Key="two/m.bin", Body=data,
                                     ACL="public-read")
    r = cli("cp", "--src-endpoint-url", moto_s3_public.endpoint_url, "--src-no-sign-request",
            "--dst-endpoint-url", moto_s3.endpoint_url, f"s3://{S3_BUCKET}/two/m.bin",
            f"s3://{S3_BUCKET}/two/copied.bin", env=s3_env(moto_s3, tmp_path))
    assert r.returncode == 0, r.stderr
    assert moto_s3.get(S3_BUCKET, "two/copied.bin") == data
    assert not moto_s3_public.exists(S3_BUCKET, "two/copied.bin")


def test_missing_bucket_is_found_before_reading(tmp_path: Path, moto_s3: Any) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(b"x" * 1000)
    r = cli("cp", "-r", "--endpoint-url", moto_s3.endpoint_url, str(src),
            "s3://no-such-bucket-here/p/", env=s3_env(moto_s3, tmp_path))
    assert r.returncode == 1
    assert "bucket 'no-such-bucket-here' does not exist" in r.stderr
    assert r.stderr.count("does not exist") == 1 and r.stdout == ""  # once, for the bucket
