"""``tensorstream cp``/``sync``/``rm``/``ls`` as aws s3 / s5cmd / rclone users type them:
the real CLI in a subprocess against local files, moto and redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli_env import s3_env

S3_BUCKET = "tensorstream-tests"


def cli(*argv: str, env: dict[str, str] | None = None, **kw: Any
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120, env=env, **kw)


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


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


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


# -- selection and idempotence --------------------------------------------------------
def test_exclude_include_in_order_and_dryrun(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name in ("a.safetensors", "b.pt", "sub/c.safetensors", "sub/d.json"):
        (src / name).write_bytes(name.encode())
    r = cli("cp", "-r", "--exclude", "*", "--include", "*.safetensors", str(src),
            str(tmp_path / "o1"))
    assert r.returncode == 0, r.stderr
    assert sorted(files_under(tmp_path / "o1")) == ["a.safetensors", "sub/c.safetensors"]
    # order matters: the last matching rule wins, so an --include before any --exclude
    # changes nothing (refused: s5cmd and rclone read it as "only these")
    r = cli("cp", "-r", "--include", "*.safetensors", "--exclude", "*", str(src),
            str(tmp_path / "o2"))
    assert r.returncode == 2 and not (tmp_path / "o2").exists()
    assert "--exclude '*' --include '*.safetensors'" in r.stderr
    r = cli("cp", "-r", "--exclude", "*", "--include", "*.safetensors", "--exclude", "sub/*",
            str(src), str(tmp_path / "o2"))
    assert r.returncode == 0 and sorted(files_under(tmp_path / "o2")) == ["a.safetensors"]
    r = cli("cp", "-r", "--exclude", "sub/*", "--dryrun", str(src), str(tmp_path / "o3"))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        f"(dryrun) copy: {src / n} -> {tmp_path / 'o3' / n}" for n in ("a.safetensors", "b.pt")]
    assert not (tmp_path / "o3").exists()
    assert r.stderr.strip() == "(dryrun) would copy 2 files"


def test_sync_copies_only_what_differs_and_deletes_on_request(tmp_path: Path,
                                                            redis_server: Any) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name in ("a.bin", "sub/b.bin", "c.bin"):
        (src / name).write_bytes(os.urandom(50_000))
    dst = redis_server.url("sync-test/")
    r = cli("sync", str(src), dst)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("copy: ") == 3
    r = cli("sync", str(src), dst)
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.strip() == "3 already there and unchanged"
    (src / "c.bin").write_bytes(os.urandom(60_000))
    (src / "a.bin").unlink()
    r = cli("sync", str(src), dst)
    assert r.stdout.splitlines() == [f"copy: {src / 'c.bin'} -> {dst}c.bin"]
    r = cli("sync", "--delete", "--dryrun", str(src), dst)
    assert r.stdout.splitlines() == [f"(dryrun) delete: {dst}a.bin"]
    r = cli("sync", "--delete", str(src), dst)
    assert r.returncode == 0 and r.stdout.splitlines() == [f"delete: {dst}a.bin"]
    r = cli("ls", "-r", dst)
    assert r.stdout.splitlines() == ["c.bin", "sub/b.bin"]


def test_sync_delete_that_fails_says_so_in_json_without_the_password(
        tmp_path: Path, redis_server: Any) -> None:
    """A delete refused by the destination: the ``--json`` line's ``error`` carried the
    destination URI with its password in the clear, and the summary said ``"errors": []``
    beside exit status 3."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.bin", "z.bin"):
        (src / name).write_bytes(name.encode())
    assert cli("sync", str(src), redis_server.url("sync-nodel/")).returncode == 0
    (src / "z.bin").unlink()
    with redis_server.client() as admin:  # may read and write, may not delete
        admin.execute_command("ACL", "SETUSER", "nodel", "on", ">nodel-S3CRET", "~*", "&*",
                              "+@all", "-del", "-unlink", "-eval", "-evalsha")
    r = cli("sync", "--delete", "--json", str(src),
            redis_server.url("sync-nodel/", user="nodel", password="nodel-S3CRET"))
    assert r.returncode == 3, r.stderr
    assert "nodel-S3CRET" not in r.stdout + r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    failed = [x for x in lines if x["op"] == "delete"]
    assert [x["status"] for x in failed] == ["failed"] and "***" in failed[0]["error"]
    assert lines[-1]["op"] == "summary" and lines[-1]["errors"] == [failed[0]["error"]]


def test_sync_copies_a_same_size_update_dated_before_the_last_copy(tmp_path: Path) -> None:
    """A local copy kept the time it was written, and sync took "a destination at least as
    new as its source" for unchanged: an update of the same size (model weights of one
    architecture always are) dated before that copy was made (a server clock behind ours,
    HTTP's and S3's whole seconds, a file moved into place with its old date) was never
    copied. The copy now carries its source's date, as aws s3 cp and rclone set it."""
    from tensorstream.testing.http_server import HTTPTestServer

    now = time.time()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "w.bin").write_bytes(b"A" * 1000)
    os.utime(src / "w.bin", (now - 3600, now - 3600))
    with HTTPTestServer() as server:
        server.put("d/h.bin", b"A" * 1000, mtime=now - 3600)
        for source in (str(src), server.url("d/h.bin")):
            assert cli("sync", source, str(dst)).stdout.startswith("copy: ")
            assert cli("sync", source, str(dst)).stderr.strip() == "1 already there and unchanged"
        assert {int(os.stat(p).st_mtime) for p in dst.iterdir()} == {int(now - 3600)}
        new = tmp_path / "new.bin"  # written earlier, moved into place now
        new.write_bytes(b"B" * 1000)
        os.utime(new, (now - 1800, now - 1800))
        os.replace(new, src / "w.bin")
        server.put("d/h.bin", b"B" * 1000, mtime=now - 1800)
        for source in (str(src), server.url("d/h.bin")):
            r = cli("sync", source, str(dst))
            assert r.returncode == 0 and r.stdout.startswith("copy: "), r.stderr
    assert files_under(dst) == {"w.bin": b"B" * 1000, "h.bin": b"B" * 1000}


def test_an_interrupted_sync_says_to_run_the_same_sync(tmp_path: Path, moto_s3: Any) -> None:
    """SIGTERM after some objects of a sync: the message said "(--resume skips them next
    time)", a flag sync refuses ("unrecognized arguments: --resume"). It says sync does."""
    import signal

    from tensorstream.testing.proxy import HTTPFaultProxy

    for i in range(4):
        moto_s3.put(S3_BUCKET, f"intr/f{i}.bin", os.urandom(1 << 20))
    dst = tmp_path / "dst"
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        proxy.faults.rate_limit = 1 << 20  # about a second per object
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorstream", "sync", "--jobs", "1", "--concurrency", "1",
             "--endpoint-url", proxy.url, f"s3://{S3_BUCKET}/intr/", str(dst)],
            env=s3_env(moto_s3, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        deadline = time.monotonic() + 60
        # Two published: the first one's outcome is surely counted (one object at a time).
        while not (dst.exists() and sum(not n.startswith(".") for n in os.listdir(dst)) >= 2):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "were copied completely before that (sync skips them next time)" in err
    assert "--resume" not in err


def test_sync_delete_from_one_object_deletes_nothing(tmp_path: Path, moto_s3: Any) -> None:
    """SRC naming one object has no keys "under" it: --delete took every object under DST
    for extraneous and deleted them all, the object it had just copied included."""
    (tmp_path / "one.bin").write_bytes(b"one")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "other.bin").write_bytes(b"other")
    moto_s3.put(S3_BUCKET, "sync-one/one.bin", b"one")
    moto_s3.put(S3_BUCKET, "sync-one-dst/other.bin", b"other")
    env = s3_env(moto_s3, tmp_path)
    s3 = ["--endpoint-url", moto_s3.endpoint_url]
    for src, to in [(str(tmp_path / "one.bin"), str(dst) + "/"),
                    (f"s3://{S3_BUCKET}/sync-one/one.bin", f"s3://{S3_BUCKET}/sync-one-dst/")]:
        for dryrun in (["--dryrun"], []):
            r = cli(*s3, "sync", "--delete", *dryrun, src, to, env=env)
            assert r.returncode == 3, r.stderr
            assert "delete: " not in r.stdout
            assert f"--delete skipped: {src} is not a directory or prefix" in r.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["one.bin", "other.bin"]
    assert moto_s3.get(S3_BUCKET, "sync-one-dst/other.bin") == b"other"
    assert moto_s3.get(S3_BUCKET, "sync-one-dst/one.bin") == b"one"


def test_sync_delete_keeps_what_a_source_entry_skipped_for_a_problem_has_at_dst(
        tmp_path: Path) -> None:
    """A broken symlink in SRC is skipped with an error: it is there, only unreadable, so its
    copy at DST is not extraneous (it was deleted, with an exit status saying 3 either way)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    (src / "target.bin").write_bytes(b"t")
    (src / "link.bin").symlink_to("target.bin")
    assert cli("sync", str(src), str(dst)).returncode == 0
    (src / "target.bin").unlink()
    r = cli("sync", "--delete", str(src), str(dst))
    assert r.returncode == 3, r.stderr
    assert "delete: " not in r.stdout and "--delete skipped" in r.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["a.bin", "link.bin", "target.bin"]


def test_sync_delete_refuses_a_source_inside_its_destination(tmp_path: Path,
                                                            moto_s3: Any) -> None:
    """``sync --delete models/llama models/``: SRC's own objects are under DST but not
    "under SRC" as DST's keys go (``llama/w.bin``), so --delete deleted the source itself
    (exit 0). Refused before anything is copied, as rclone refuses overlapping remotes; a
    prefix that only starts with the same letters (``p`` and ``p2/``) is no overlap."""
    models = tmp_path / "models"
    (models / "llama").mkdir(parents=True)
    (models / "llama" / "w.bin").write_bytes(b"w")
    (models / "other.bin").write_bytes(b"o")
    env = s3_env(moto_s3, tmp_path)
    s3 = ["--endpoint-url", moto_s3.endpoint_url]
    for key in ("ovl/p/sub/a", "ovl/p/b", "ovl/p2/c"):
        moto_s3.put(S3_BUCKET, key, b"x")
    for src, dst in [(models / "llama", models), (models, models),
                     (models / "llama", models / ".." / "models"),
                     (f"s3://{S3_BUCKET}/ovl/p/sub/", f"s3://{S3_BUCKET}/ovl/p"),
                     (f"s3://{S3_BUCKET}/ovl/p/sub", f"s3://{S3_BUCKET}/")]:
        for dryrun in ([], ["--dryrun"]):
            r = cli(*s3, "sync", "--delete", *dryrun, str(src), str(dst), env=env)
            assert r.returncode == 2, r.stderr
            assert "it would delete the source itself" in r.stderr and r.stdout == ""
    assert files_under(models) == {"llama/w.bin": b"w", "other.bin": b"o"}
    assert all(moto_s3.exists(S3_BUCKET, k) for k in ("ovl/p/sub/a", "ovl/p/b", "ovl/p2/c"))
    r = cli(*s3, "sync", "--delete", f"s3://{S3_BUCKET}/ovl/p2/", f"s3://{S3_BUCKET}/ovl/p",
            env=env)
    assert r.returncode == 0, r.stderr
    assert moto_s3.exists(S3_BUCKET, "ovl/p2/c") and moto_s3.exists(S3_BUCKET, "ovl/p/c")
    assert not moto_s3.exists(S3_BUCKET, "ovl/p/b")  # DST's own extraneous object: deleted


def test_a_prefix_is_never_copied_into_a_prefix_under_it(tmp_path: Path, moto_s3: Any) -> None:
    """``sync s3://b/q/ s3://b/q/bk/`` copied q/bk/x to q/bk/bk/x, and each run went a level
    deeper (a local directory into itself was refused already). Refused the same way; a
    sibling prefix that only starts with the same letters is copied."""
    env = s3_env(moto_s3, tmp_path)
    s3 = ["--endpoint-url", moto_s3.endpoint_url]
    for key in ("nest/a", "nest/bk/x"):
        moto_s3.put(S3_BUCKET, key, b"x")
    for cmd in (["sync"], ["cp", "-r"]):
        r = cli(*s3, *cmd, f"s3://{S3_BUCKET}/nest/", f"s3://{S3_BUCKET}/nest/bk/", env=env)
        assert r.returncode == 1 and "cannot copy a prefix into itself" in r.stderr, r.stderr
    assert not moto_s3.exists(S3_BUCKET, "nest/bk/a")
    assert not moto_s3.exists(S3_BUCKET, "nest/bk/bk/x")
    r = cli(*s3, "sync", f"s3://{S3_BUCKET}/nest/", f"s3://{S3_BUCKET}/nest2/", env=env)
    assert r.returncode == 0 and moto_s3.exists(S3_BUCKET, "nest2/bk/x"), r.stderr


def test_a_copy_into_itself_says_what_to_do_and_runs_with_the_destination_left_out(
        tmp_path: Path, moto_s3: Any) -> None:
    """``sync s3://b/p s3://b/p/bk`` (and a local directory into its own subdirectory) was
    refused without saying what to do. It names the two ways out; the second, an --exclude
    that leaves every key under DST out of SRC (rclone's rule for overlapping remotes), now
    runs, and a second run finds everything copied (nothing a level deeper). An --include
    after it that takes a copy under DST back (``bk/d/c`` by ``*c``): still refused."""
    env = s3_env(moto_s3, tmp_path)
    s3 = ["--endpoint-url", moto_s3.endpoint_url]
    top = f"into-{os.urandom(4).hex()}"  # a prefix of this test's own
    for key in ("a", "d/c", "bk/x"):
        moto_s3.put(S3_BUCKET, f"{top}/{key}", b"x")
    local = tmp_path / "self2"
    (local / "d").mkdir(parents=True)
    (local / "bk").mkdir()
    for key in ("a", "d/c", "bk/x"):
        (local / key).write_bytes(b"x")
    for src, dst in [(f"s3://{S3_BUCKET}/{top}", f"s3://{S3_BUCKET}/{top}/bk"),
                     (str(local), str(local / "bk"))]:
        for cmd in (["sync"], ["cp", "-r"]):
            r = cli(*s3, *cmd, src, dst, env=env)
            assert r.returncode == 1 and "into itself" in r.stderr, r.stderr
            assert "outside" in r.stderr and "--exclude 'bk/*'" in r.stderr, r.stderr
            r = cli(*s3, *cmd, "--exclude", "bk/*", "--include", "*c", src, dst, env=env)
            assert r.returncode == 1 and "into itself" in r.stderr, r.stderr
            assert "its copy bk/d/c would be copied again" in r.stderr, r.stderr
        for run in range(2):
            r = cli(*s3, "sync", "--exclude", "bk/*", src, dst, env=env)
            assert r.returncode == 0, r.stderr
            assert ("copied 2 files" if run == 0 else "2 already there") in r.stderr + r.stdout
    assert moto_s3.exists(S3_BUCKET, f"{top}/bk/a") and moto_s3.exists(S3_BUCKET, f"{top}/bk/d/c")
    assert not moto_s3.exists(S3_BUCKET, f"{top}/bk/bk/x")
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file()) == [
        "a", "bk/a", "bk/d/c", "bk/x", "d/c"]


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


def test_a_pattern_that_can_never_match_is_a_usage_error(tmp_path: Path) -> None:
    """``--exclude /abs/path/x`` (or an empty pattern) matches no key, since keys are relative
    to SRC: what it was meant to leave out was copied without a word."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "secret.key").write_bytes(b"k")
    for cmd in (["cp", "-r"], ["sync"]):
        for flag, pattern in [("--exclude", str(src / "secret.key")), ("--include", "")]:
            r = cli(*cmd, flag, pattern, str(src), str(tmp_path / "dst"))
            assert r.returncode == 2, r.stderr
            assert r.stderr.startswith(f"tensorstream: error: {flag} ") and "Traceback" not in r.stderr
    assert not (tmp_path / "dst").exists()
    # rm -r: such a pattern deleted what it was meant to keep
    r = cli("rm", "-r", "--exclude", str(src / "secret.key"), str(src))
    assert r.returncode == 2 and "--exclude" in r.stderr and "matches no key" in r.stderr
    assert (src / "secret.key").read_bytes() == b"k"


def test_a_pattern_naming_a_directory_is_a_usage_error_that_says_what_to_write(
        tmp_path: Path) -> None:
    """``--exclude keep/`` matches no key (keys name objects; 'keep/*' is what matches): `rm -r`
    deleted everything under keep/, `sync --delete` the destination's keep/, exit 0."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "keep").mkdir(parents=True)
    (src / "keep" / "a.bin").write_bytes(b"a")
    (src / "b.bin").write_bytes(b"b")
    (dst / "keep").mkdir(parents=True)
    (dst / "keep" / "mine.bin").write_bytes(b"mine")
    for argv in (["rm", "-r", "--exclude", "keep/", str(src)],
                 ["sync", "--delete", "--exclude", "keep/", str(tmp_path / "empty"), str(dst)],
                 ["cp", "-r", "--include", "*/", str(src), str(tmp_path / "out")]):
        r = cli(*argv)
        assert r.returncode == 2, r.stderr
        assert "matches no key" in r.stderr and "/*'" in r.stderr
    assert (src / "keep" / "a.bin").read_bytes() == b"a"
    assert (dst / "keep" / "mine.bin").read_bytes() == b"mine"
    r = cli("rm", "-r", "--dryrun", "--exclude", "keep/*", str(src))
    assert r.returncode == 0 and "keep" not in r.stdout and "b.bin" in r.stdout, r.stderr


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


# -- output -------------------------------------------------------------------------------
def test_json_is_one_object_per_file_then_a_summary(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(name.encode() * 10)
    r = cli("cp", "--json", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "missing"),
            str(tmp_path / "out") + "/")
    assert r.returncode == 3, r.stderr  # partial: two copied, one failed
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["op"] for x in lines] == ["copy", "copy", "summary"]
    assert {x["status"] for x in lines[:2]} == {"copied"}
    assert lines[-1]["files"] == 2 and len(lines[-1]["errors"]) == 1


def test_json_has_a_failed_line_for_each_object_refused_while_planning(tmp_path: Path) -> None:
    """Objects refused before their copy (unsafe names, onto itself) were only in the summary's
    `errors`: a reader of the per-object lines saw 1 copied and no failure, exit 3."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.bin").write_bytes(b"ok")
    (src / "back\\slash").write_bytes(b"b")
    (src / "new\nline").write_bytes(b"n")
    r = cli("cp", "-r", "--json", str(src), str(tmp_path / "dst"))
    assert r.returncode == 3, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    failed = sorted(x["src"] for x in lines if x.get("status") == "failed")
    assert failed == [str(src / "back\\slash"), str(src / "new\nline")]
    assert [x["status"] for x in lines if x["op"] == "copy"].count("copied") == 1
    assert lines[-1]["op"] == "summary" and len(lines[-1]["errors"]) == 2
    assert lines[-1]["summary"].endswith("; 2 failed")
    r = cli("cp", "--json", str(src / "ok.bin"), str(src) + "/")  # onto itself
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 1 and [x["status"] for x in lines[:-1]] == ["failed"]
    assert "same object" in lines[0]["error"] and lines[-1]["summary"] == "1 failed"


def test_quiet_and_only_show_errors(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    r = cli("cp", "--quiet", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    r = cli("cp", "--only-show-errors", str(tmp_path / "a"), str(tmp_path / "nope"),
            str(tmp_path / "o") + "/")
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.startswith("tensorstream: error: ") and r.stderr.count("\n") == 1


def test_quiet_still_says_what_made_the_status_partial(tmp_path: Path) -> None:
    """`--quiet` with a broken symlink in SRC exited 3 and printed nothing at all: the
    skip that made the copy partial is said (a link left out by choice is not)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.bin").write_bytes(b"ok")
    (src / "gone.bin").symlink_to("nowhere")
    (src / "link.bin").symlink_to("ok.bin")
    r = cli("cp", "-r", "--quiet", str(src), str(tmp_path / "out"))
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr == f"tensorstream: skipped {src / 'gone.bin'}: broken symbolic link\n"
    r = cli("cp", "-r", "--quiet", "--no-follow-symlinks", str(src), str(tmp_path / "out2"))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")  # links left out by choice


def test_closed_pipe_exits_zero(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(os.urandom(20 << 20))
    cmd = (f"set -o pipefail; {sys.executable} -m tensorstream cat {tmp_path / 'big'} "
           "| head -c 16 > /dev/null")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_a_closed_pipe_does_not_stop_a_copy(tmp_path: Path) -> None:
    """`cp -r ... | head -1`: the reader of the log went away; every file is
    still copied, no traceback, and the status is the copy's own."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"f{i:03d}").write_bytes(os.urandom(64) + bytes([i % 256]))
    for flags in ("", "--json"):
        dst = tmp_path / f"dst{flags}"
        cmd = (f"set -o pipefail; {sys.executable} -m tensorstream cp -r {flags} {src}/ {dst}/ "
               "| head -1 > /dev/null")
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr and "rror" not in r.stderr, r.stderr
        assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in src.iterdir())
        assert all((dst / p.name).read_bytes() == p.read_bytes() for p in src.iterdir())
    # A failure is still a failure when nobody reads the log.
    cmd = (f"{sys.executable} -m tensorstream cp -r --json {src}/ {tmp_path / 'nope'} "
           f"{tmp_path / 'out'}/ | head -1 > /dev/null; exit ${{PIPESTATUS[0]}}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr


def test_names_with_control_characters_are_escaped(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    evil = "a\x1b[2Jb\nfake: line.bin"
    (d / evil).write_bytes(b"x")
    r = cli("ls", str(d))
    assert r.returncode == 0
    assert r.stdout == "a\\x1b[2Jb\\nfake: line.bin\n"
    r = cli("ls", "--json", str(d))
    assert json.loads(r.stdout.splitlines()[0])["key"] == evil
    r = cli("cp", "-r", str(d), str(tmp_path / "o"))
    assert "\x1b" not in r.stdout + r.stderr
    assert "key 'a\\x1b[2Jb\\nfake: line.bin' contains control characters" in r.stderr


def test_ls_lists_buckets_and_human_sizes(tmp_path: Path, moto_s3: Any) -> None:
    env = s3_env(moto_s3, tmp_path)
    r = cli("--endpoint-url", moto_s3.endpoint_url, "ls", "s3://", env=env)
    assert r.returncode == 0, r.stderr
    assert any(line.endswith(f" {S3_BUCKET}") for line in r.stdout.splitlines())
    r = cli("--endpoint-url", moto_s3.endpoint_url, "ls", "--json", "s3://", env=env)
    assert S3_BUCKET in {json.loads(x)["bucket"] for x in r.stdout.splitlines()}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "m.bin").write_bytes(b"x" * 1536)
    r = cli("ls", "-lh", str(tmp_path / "d"))
    assert r.returncode == 0 and r.stdout.rstrip().endswith("1.50 KiB m.bin")
    # aws s3 ls --summarize: the count and total of the objects listed (not under PRE lines)
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "n.bin").write_bytes(b"y" * 512)
    r = cli("ls", "--summarize", str(tmp_path / "d"))
    assert r.stdout.splitlines()[-2:] == ["Total Objects: 1", "   Total Size: 1536"]
    r = cli("ls", "-rh", "--summarize", str(tmp_path / "d"))
    assert r.stdout.splitlines()[-2:] == ["Total Objects: 2", "   Total Size: 2.00 KiB"]
    r = cli("ls", "-r", "--json", "--summarize", str(tmp_path / "d"))
    assert json.loads(r.stdout.splitlines()[-1]) == {"total_objects": 2, "total_size": 2048}
    # a bucket that does not exist is named as such, not "no objects"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "ls", "s3://no-such-bucket-here/x/", env=env)
    assert r.returncode == 1 and "no such bucket 'no-such-bucket-here'" in r.stderr, r.stderr


def test_rediss_to_a_plain_text_port_fails_fast_and_says_so(redis_server: Any) -> None:
    import time

    url = redis_server.url("x").replace("redis://", "rediss://", 1)
    t0 = time.monotonic()
    r = cli("stat", url)
    took = time.monotonic() - t0
    assert r.returncode == 1
    assert "speaks plain-text Redis, not TLS: use redis:// instead of rediss://" in r.stderr
    assert took < 8, took  # was 51 s: five connect timeouts


def test_missing_source_bucket_is_named(tmp_path: Path, moto_s3: Any) -> None:
    r = cli("cp", "--endpoint-url", moto_s3.endpoint_url, "s3://no-such-bucket-src/k.bin",
            str(tmp_path / "x"), env=s3_env(moto_s3, tmp_path))
    assert r.returncode == 1
    assert "bucket 'no-such-bucket-src' does not exist" in r.stderr, r.stderr


def test_rerun_without_resume_says_it_discards_the_partial(tmp_path: Path) -> None:
    (tmp_path / "src.bin").write_bytes(os.urandom(100_000))
    out = tmp_path / "out"
    out.mkdir()
    (out / ".dst.bin.tensorstream-journal.tmp").write_text("{}")
    (out / ".dst.bin.tensorstream-partial.tmp").write_bytes(b"x" * 10)
    r = cli("cp", str(tmp_path / "src.bin"), str(out / "dst.bin"))
    assert r.returncode == 0, r.stderr
    assert (f"tensorstream: {out / 'dst.bin'}: an interrupted --resume copy was left here; "
            "without --resume it is discarded and the copy starts over") in r.stderr


def test_tls_diagnoses_in_cli_terms(tmp_path: Path, http_server: Any, https_server: Any,
                                    http_reset: None) -> None:
    http_server.put("tls/m.bin", b"x" * 1000)
    https_server.put("tls/m.bin", b"x" * 1000)
    plain = http_server.url("tls/m.bin").replace("http://", "https://", 1)
    r = cli("cp", "--retries", "1", plain, str(tmp_path / "a"))
    assert r.returncode == 1
    assert "answered in plain text, not TLS" in r.stderr and "use http:// instead of https://" \
        in r.stderr
    assert "ca_bundle" not in r.stderr and "ca-bundle" not in r.stderr
    r = cli("cp", "--retries", "1", https_server.url("tls/m.bin"), str(tmp_path / "b"))
    assert r.returncode == 1
    assert "--ca-bundle FILE" in r.stderr and "--no-verify-ssl" in r.stderr
    assert "ca_bundle=" not in r.stderr and "insecure=True" not in r.stderr
    # the flag it names works, before or after the command
    r = cli("--no-verify-ssl", "cp", https_server.url("tls/m.bin"), str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    r = cli("cp", "--ca-bundle", https_server.ca_bundle_path, https_server.url("tls/m.bin"),
            str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr


def test_missing_http_object_is_a_plain_404(tmp_path: Path, http_server: Any,
                                            http_reset: None) -> None:
    r = cli("cp", http_server.url("nothing/here.bin"), str(tmp_path / "x"))
    assert r.returncode == 1
    assert "404" in r.stderr and "list" not in r.stderr, r.stderr


# -- wildcards (s5cmd) ------------------------------------------------------------
def test_wildcard_sources_copy_what_they_match_like_s5cmd(tmp_path: Path, moto_s3: Any) -> None:
    for key in ("wild/llama/model-00001.safetensors", "wild/llama/model-00002.safetensors",
                "wild/llama/config.json", "wild/llama/sub/extra.safetensors",
                "wild/llama-evil/model.safetensors", "wild/mistral/config.json"):
        moto_s3.put(S3_BUCKET, key, key.encode())
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    out = tmp_path / "out"
    r = cli("cp", *ep, f"s3://{S3_BUCKET}/wild/llama/*.safetensors", str(out) + "/", env=env)
    assert r.returncode == 0, r.stderr
    # '*' crosses '/', names are relative to the last '/' before the first wildcard.
    assert files_under(out) == {
        "model-00001.safetensors": b"wild/llama/model-00001.safetensors",
        "model-00002.safetensors": b"wild/llama/model-00002.safetensors",
        "sub/extra.safetensors": b"wild/llama/sub/extra.safetensors"}
    r = cli("cp", *ep, f"s3://{S3_BUCKET}/wild/*/config.json",
            f"s3://{S3_BUCKET}/wild/llama/model-0000?.safetensors", str(tmp_path / "o2"), env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(files_under(tmp_path / "o2")) == [
        "llama/config.json", "mistral/config.json", "model-00001.safetensors",
        "model-00002.safetensors"]
    r = cli("ls", *ep, f"s3://{S3_BUCKET}/wild/llama*/*.safetensors", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "llama-evil/model.safetensors", "llama/model-00001.safetensors",
        "llama/model-00002.safetensors", "llama/sub/extra.safetensors"]


def test_wildcard_sources_say_what_went_wrong(tmp_path: Path, moto_s3: Any) -> None:
    moto_s3.put(S3_BUCKET, "wild2/a.bin", b"a")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("cp", *ep, f"s3://{S3_BUCKET}/wild2/*.json", str(tmp_path / "o") + "/", env=env)
    assert r.returncode == 1 and "no object matches" in r.stderr
    r = cli("ls", *ep, f"s3://{S3_BUCKET}/wild2/*.json", env=env)
    assert r.returncode == 1 and "no object matches" in r.stderr
    r = cli("cp", *ep, "s3://tensorstream-*/wild2/a.bin", str(tmp_path / "o") + "/", env=env)
    assert r.returncode != 0 and "not bucket names" in r.stderr
    r = cli("cp", *ep, "--raw", f"s3://{S3_BUCKET}/wild2/*.bin", str(tmp_path / "o") + "/",
            env=env)
    assert r.returncode == 1 and "no such object" in r.stderr  # taken literally
    r = cli("sync", *ep, "--delete", f"s3://{S3_BUCKET}/wild2/*", str(tmp_path / "o"), env=env)
    assert r.returncode == 2 and "--delete with the wildcard source" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_wildcard_matches_redis_keys(tmp_path: Path, redis_server: Any) -> None:
    src = tmp_path / "src"
    (src / "m").mkdir(parents=True)
    for name in ("m/a.bin", "m/b.txt", "c.bin"):
        (src / name).write_bytes(name.encode())
    assert cli("cp", "-r", str(src), redis_server.url("wild/")).returncode == 0
    r = cli("cp", redis_server.url("wild/*.bin"), str(tmp_path / "out") + "/")
    assert r.returncode == 0, r.stderr
    assert files_under(tmp_path / "out") == {"c.bin": b"c.bin", "m/a.bin": b"m/a.bin"}


def test_rm_of_a_wildcard_deletes_what_it_matches_and_nothing_else(tmp_path: Path,
                                                                   moto_s3: Any) -> None:
    for key in ("wildrm/a.pt", "wildrm/sub/b.pt", "wildrm/c.bin", "wildrm-x/d.pt"):
        moto_s3.put(S3_BUCKET, key, b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("rm", *ep, "--dryrun", f"s3://{S3_BUCKET}/wildrm/*.pt", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"(dryrun) delete: s3://{S3_BUCKET}/wildrm/a.pt",
                                     f"(dryrun) delete: s3://{S3_BUCKET}/wildrm/sub/b.pt"]
    r = cli("rm", *ep, "--exclude", "sub/*", f"s3://{S3_BUCKET}/wildrm/*.pt", env=env)
    assert r.returncode == 0 and r.stdout.splitlines() == [
        f"delete: s3://{S3_BUCKET}/wildrm/a.pt"]
    r = cli("ls", *ep, "-r", f"s3://{S3_BUCKET}/", env=env)
    assert {"wildrm/sub/b.pt", "wildrm/c.bin", "wildrm-x/d.pt"} <= set(r.stdout.split())
    assert "wildrm/a.pt" not in r.stdout.split()
    r = cli("rm", *ep, f"s3://{S3_BUCKET}/wildrm/*.json", env=env)
    assert r.returncode == 1 and "no object matches" in r.stderr
    r = cli("rm", *ep, "--raw", f"s3://{S3_BUCKET}/wildrm/*.pt", env=env)
    assert r.returncode != 0 and "wildrm/sub/b.pt" not in r.stdout  # one literal key only
