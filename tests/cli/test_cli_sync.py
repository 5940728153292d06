"""``tensorstream sync`` (and ``cp -r`` into itself) as aws s3 sync / rclone users run it:
what is copied again, what ``--delete`` deletes and refuses, an interrupted sync; the real
CLI in a subprocess against local files, moto and redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli_env import cli, files_under, s3_env

S3_BUCKET = "tensorstream-tests"


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


def test_sync_into_redis_copies_a_same_size_update_dated_before_the_last_copy(
        tmp_path: Path, redis_server: Any) -> None:
    """The Redis neighbour of the test above: a copy into Redis was dated when it was
    written, so a same-size update dated before that (a file fetched with its server's
    date by ``aws s3 cp``, ``wget``, ``curl -R``, unpacked by ``tar``, moved into place)
    was "older than its copy" and never copied, sync after sync. A copy into Redis now
    carries its source's date, as a local copy does; an object written there otherwise
    is dated when written."""
    import tensorstream

    now = time.time()
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"A" * 1000)
    os.utime(src / "w.bin", (now - 3600, now - 3600))
    dst = redis_server.url("sync-dated/")
    assert cli("sync", str(src), dst).stdout.startswith("copy: ")
    assert cli("sync", str(src), dst).stderr.strip() == "1 already there and unchanged"
    assert abs(_manifest_mtime(redis_server, "sync-dated/w.bin") - (now - 3600)) < 1e-5
    new = tmp_path / "new.bin"  # written earlier, moved into place now
    new.write_bytes(b"B" * 1000)
    os.utime(new, (now - 1800, now - 1800))
    os.replace(new, src / "w.bin")
    r = cli("sync", str(src), dst)
    assert r.returncode == 0 and r.stdout.startswith("copy: "), r.stderr
    with tensorstream.open(dst + "w.bin", "rb") as f:
        assert f.read() == b"B" * 1000
    assert cli("sync", str(src), dst).stderr.strip() == "1 already there and unchanged"
    with tensorstream.open(dst + "w.bin", "wb") as f:  # changed there after the copy
        f.write(b"X" * 1000)
    assert cli("sync", str(src), dst).stdout.startswith("copy: ")
    with tensorstream.open(dst + "w.bin", "rb") as f:
        assert f.read() == b"B" * 1000
    # Written otherwise (no source to take a date from): dated when written.
    with tensorstream.open(dst + "direct.bin", "wb") as f:
        f.write(b"C")
    assert abs(_manifest_mtime(redis_server, "sync-dated/direct.bin") - time.time()) < 60


def _manifest_mtime(server: Any, key: str) -> float:
    """The ``mtime`` field of the manifest of the tensorstream object at ``key``."""
    with server.client() as c:
        return float(c.hget(key, "mtime"))


def test_sync_copies_again_a_local_copy_changed_after_it_was_made(tmp_path: Path,
                                                                 moto_s3: Any) -> None:
    """A local copy carries its source's date, so a copy dated otherwise was changed
    after the copy: a file of the copy rewritten with as many bytes (edited, damaged, a
    download of another version over it) was "newer than its source", taken as
    unchanged, and sync never put the source's bytes back (exit 0). aws s3 sync
    downloads an object again when the file is newer, rclone when the dates differ; so
    does sync now, from S3 or a local directory. ``cp -r --resume`` still skips it (a
    complete file at least as new as its source, as documented)."""
    env = s3_env(moto_s3, tmp_path)
    ep = ["--endpoint-url", moto_s3.endpoint_url]
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"A" * 1000)
    (src / "k.bin").write_bytes(b"K" * 10)
    assert cli("cp", "-r", *ep, str(src), f"s3://{S3_BUCKET}/edited/", env=env).returncode == 0
    for source in (f"s3://{S3_BUCKET}/edited/", str(src)):
        dst = tmp_path / ("from-s3" if source.startswith("s3:") else "from-dir")
        assert cli("sync", *ep, source, str(dst), env=env).stdout.count("copy: ") == 2
        (dst / "w.bin").write_bytes(b"X" * 1000)  # after the copy: dated now
        r = cli("cp", "-r", "--resume", *ep, source, str(dst), env=env)
        assert r.returncode == 0 and r.stdout == "", r.stderr
        r = cli("sync", *ep, source, str(dst), env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"copy: {source.rstrip('/')}/w.bin -> {dst}/w.bin"]
        assert files_under(dst) == {"w.bin": b"A" * 1000, "k.bin": b"K" * 10}
        r = cli("sync", *ep, source, str(dst), env=env)
        assert r.stderr.strip() == "2 already there and unchanged", r.stderr


def test_sync_skips_a_copy_on_a_filesystem_keeping_coarser_dates(tmp_path: Path,
                                                                 moto_s3: Any) -> None:
    """A local copy carries its source's date as far as its filesystem keeps one: FAT
    to 2 s (truncated by Linux, rounded up by others), HFS+, ext3 and some NFS to 1 s,
    exFAT to 10 ms. A source dated to the nanosecond (or S3's odd second, onto FAT) was
    "dated otherwise" than its copy and copied again on every sync. The dates the copy
    was stored with (set here as such a filesystem keeps them) are its source's now; a
    copy changed after it was made, dated at a whole second too, is still copied again."""
    env = s3_env(moto_s3, tmp_path)
    ep = ["--endpoint-url", moto_s3.endpoint_url]
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"W" * 100)
    when = 1_700_000_001_123_456_789  # an odd second, to the nanosecond
    os.utime(src / "w.bin", ns=(when, when))
    assert cli("cp", *ep, str(src / "w.bin"), f"s3://{S3_BUCKET}/coarse/w.bin",
               env=env).returncode == 0
    second = 1_000_000_000
    grains = {"fat-truncated": lambda t: t // (2 * second) * (2 * second),
              "fat-rounded-up": lambda t: -(-t // (2 * second)) * (2 * second),
              "hfs": lambda t: t // second * second,
              "exfat": lambda t: t // 10_000_000 * 10_000_000}
    for source in (f"s3://{S3_BUCKET}/coarse/", str(src)):
        for name, kept in grains.items():
            dst = tmp_path / f"{name}-{'s3' if source.startswith('s3:') else 'dir'}"
            assert cli("sync", *ep, source, str(dst), env=env).returncode == 0
            stored = kept((dst / "w.bin").stat().st_mtime_ns)
            os.utime(dst / "w.bin", ns=(stored, stored))  # as the filesystem keeps it
            r = cli("sync", *ep, source, str(dst), env=env)
            assert (r.returncode, r.stdout) == (0, ""), (name, source, r.stdout, r.stderr)
            assert r.stderr.strip() == "1 already there and unchanged", (name, r.stderr)
        (dst / "w.bin").write_bytes(b"X" * 100)  # changed after the copy, dated now
        later = kept(time.time_ns())
        os.utime(dst / "w.bin", ns=(later, later))
        r = cli("sync", *ep, source, str(dst), env=env)
        assert r.stdout.count("copy: ") == 1, (source, r.stdout, r.stderr)
        assert files_under(dst) == {"w.bin": b"W" * 100}
    # cp -r --resume skips a complete copy at least as new, or dated as FAT keeps it.
    dst = tmp_path / "resumed"
    assert cli("cp", "-r", "--resume", str(src), str(dst)).returncode == 0
    stored = grains["fat-truncated"]((dst / "w.bin").stat().st_mtime_ns)
    os.utime(dst / "w.bin", ns=(stored, stored))
    r = cli("cp", "-r", "--resume", str(src), str(dst))
    assert (r.returncode, r.stdout) == (0, ""), (r.stdout, r.stderr)


def test_sync_skips_a_copy_of_a_file_dated_before_1980_on_fat(tmp_path: Path) -> None:
    """FAT and exFAT keep no date before 1980: Linux stores an earlier one as 1980-01-01
    00:00 local time (in UTC, that moved by the mount's zone). A file of a reproducible
    build (dated 1970, as Nix and SOURCE_DATE_EPOCH=0 date them) was copied again on every
    sync. The neighbours: a copy changed after it was made is copied again, and a source
    dated after 1980 is not taken for one kept as 1980."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"W" * 100)
    os.utime(src / "w.bin", ns=(1_000_000_000, 1_000_000_000))  # 1970-01-01 00:00:01
    floor = 315_532_800 * 1_000_000_000  # 1980-01-01 00:00 UTC
    hour = 3600 * 1_000_000_000
    for name, kept in (("utc", floor), ("utc+14", floor - 14 * hour),
                       ("utc-9:30", floor + 9 * hour + hour // 2)):
        dst = tmp_path / name
        assert cli("sync", str(src), str(dst)).returncode == 0
        os.utime(dst / "w.bin", ns=(kept, kept))  # as FAT keeps it
        r = cli("sync", str(src), str(dst))
        assert (r.returncode, r.stdout) == (0, ""), (name, r.stdout, r.stderr)
        assert r.stderr.strip() == "1 already there and unchanged", (name, r.stderr)
    (dst / "w.bin").write_bytes(b"X" * 100)  # changed there: dated now
    r = cli("sync", str(src), str(dst))
    assert r.stdout.count("copy: ") == 1, r.stdout + r.stderr
    assert files_under(dst) == {"w.bin": b"W" * 100}
    after = floor + 60 * 1_000_000_000  # a source of 1980-01-01 00:01: not the floor's
    os.utime(src / "w.bin", ns=(after, after))
    os.utime(dst / "w.bin", ns=(floor, floor))
    assert cli("sync", str(src), str(dst)).stdout.count("copy: ") == 1


def test_sync_delete_says_what_it_leaves_alone_at_a_local_destination(tmp_path: Path) -> None:
    """``sync --delete`` into a local directory never deletes a symbolic link there (nor
    through one), but it kept one that SRC lacks without a word, exit 0: DST was taken
    for a mirror of SRC and was not (aws s3 sync deletes such a link, rclone names it).
    Each is named now, with what to do; a link SRC has a file for (replaced by the copy)
    and one the rules leave out are not."""
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside"
    for d in (src, dst, outside):
        d.mkdir()
    (src / "a").write_bytes(b"a")
    (src / "kept").write_bytes(b"k")
    (outside / "o").write_bytes(b"o")
    os.symlink(outside / "o", dst / "stale-link")
    os.symlink(outside, dst / "dirlink")
    os.symlink(outside / "o", dst / "kept")  # SRC has a file: the copy replaces the link
    os.symlink(outside / "o", dst / "x.tmp")  # left out by the rules
    r = cli("sync", "--delete", "--exclude", "*.tmp", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "--delete left" in line]
    assert notes == [f"tensorstream: --delete left {dst / name} alone: a symbolic link, which "
                     "sync --delete never deletes (rm it if it should go)"
                     for name in ("dirlink", "stale-link")]
    assert sorted(os.listdir(dst)) == ["a", "dirlink", "kept", "stale-link", "x.tmp"]
    assert (dst / "kept").read_bytes() == b"k" and not (dst / "kept").is_symlink()
    assert files_under(outside) == {"o": b"o"}


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
            # (SRC itself: the same place, refused as such)
            said = "same place" if src == dst else "it would delete the source itself"
            assert said in r.stderr and r.stdout == "", r.stderr
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
