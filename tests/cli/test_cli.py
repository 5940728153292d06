"""The ``tensorstream`` command line: exit codes, JSON summary, help, secrets,
companion commands, progress on a terminal only, and kill/resume in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli
from signals import signals_as_from_a_terminal
from tensorstream.cli.main import main
from terminals import read_to_end, spawn_on_terminal

CANARY = "sk-canary-5c1d-never-print"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def last_json(out: str) -> dict[str, Any]:
    """The summary object: the last of the JSON lines ``--json`` prints."""
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["op"] == "summary"
    return lines[-1]


def test_cp_json_summary_and_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.bin").write_bytes(os.urandom(300_000))
    code, out, err = run(capsys, "cp", "--json", "--part-size", "64K", str(tmp_path / "m.bin"),
                         str(tmp_path / "o.bin"))
    assert code == 0, err
    summary = last_json(out)
    assert summary["files"] == 1 and summary["bytes"] == 300_000
    assert summary["verified"] is True and summary["errors"] == []
    assert set(summary) >= {"files", "bytes", "seconds", "gbps", "verified", "errors"}
    assert (tmp_path / "o.bin").read_bytes() == (tmp_path / "m.bin").read_bytes()


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "cp", str(tmp_path / "missing"), str(tmp_path / "x"))
    assert code == 1 and err.count("\n") == 2 and "no such file" in err  # error + summary
    assert "Traceback" not in err
    assert run(capsys, "cp", "only-one")[0] == 2
    assert run(capsys, "cp", "--no-such-flag", "a", "b")[0] == 2
    assert run(capsys, "cp", "--part-size", "lots", "a", "b")[0] == 2
    assert run(capsys, "cp", "s3:/broken", str(tmp_path / "x"))[0] in (1, 2)
    assert run(capsys, "frobnicate")[0] == 2


def test_help_reads_like_known_tools(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "cp", "--help")
    assert code == 0
    assert out.startswith("usage: tensorstream cp [options] SRC [SRC...] DST")
    for needle in ("-r, --recursive", "--concurrency", "--part-size", "--resume", "--no-verify",
                   "--json", "--s3-endpoint", "--anonymous", "--ca-bundle", "examples:",
                   "exit status"):
        assert needle in out
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "tensorstream cp s3://" in out


def test_secrets_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"redis://user:{CANARY}@127.0.0.1:1/key"
    code, out, err = run(capsys, "cp", "--debug", "--retries", "1", "--timeout-connect", "0.5",
                         "--s3-secret-access-key", CANARY, uri, str(tmp_path / "x"))
    assert code != 0
    assert CANARY not in out + err
    code, out, err = run(capsys, "cp", f"https://h.invalid/x?X-Amz-Signature={CANARY}",
                         str(tmp_path / "y"), "--retries", "1", "--timeout-connect", "0.5")
    assert code == 1 and CANARY not in out + err and "***" in err


def test_ls_stat_cat_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.bin").write_bytes(b"0123456789")
    (tmp_path / "d" / "sub" / "b.bin").write_bytes(b"xyz")
    code, out, _ = run(capsys, "ls", str(tmp_path / "d"))
    assert code == 0 and out.splitlines() == ["a.bin", "sub/"]
    code, out, _ = run(capsys, "ls", "-lr", str(tmp_path / "d"))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].endswith(" 10 a.bin")
    assert lines[1].endswith(" 3 sub/b.bin")
    code, out, _ = run(capsys, "stat", "--json", str(tmp_path / "d" / "a.bin"))
    assert code == 0 and json.loads(out)["size"] == 10
    assert run(capsys, "ls", str(tmp_path / "nothing"))[0] == 1

    r = cli("cat", "--range", "2-4", str(tmp_path / "d" / "a.bin"))
    assert r.returncode == 0 and r.stdout == "234"
    r = cli("cat", "--range", "-3", str(tmp_path / "d" / "a.bin"))
    assert r.stdout == "789"
    r = cli("cat", str(tmp_path / "d" / "sub" / "b.bin"))
    assert r.stdout == "xyz"

    assert run(capsys, "rm", str(tmp_path / "d" / "a.bin"))[0] == 0
    assert not (tmp_path / "d" / "a.bin").exists()
    assert run(capsys, "rm", str(tmp_path / "d" / "a.bin"))[0] == 1
    assert run(capsys, "rm", "-r", str(tmp_path / "d"))[0] == 0
    assert not (tmp_path / "d" / "sub" / "b.bin").exists()


def test_cp_recursive_with_traversal_keys_exits_one(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from memory_provider import MemProvider
    from tensorstream import register

    register("memtest", MemProvider, replace=True)  # not left to the order tests run in
    MemProvider.store.update({"tb/p/../escape": b"x", "tb/p/good": b"ok", "tb/p//abs": b"x"})
    code, out, err = run(capsys, "cp", "-r", "--json", "memtest://tb/p/", str(tmp_path / "dst"))
    assert code == 3  # partial: one copied, two refused
    summary = last_json(out)
    assert summary["files"] == 1 and len(summary["errors"]) == 2
    assert err.count("refused") == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["dst", "good"]


@pytest.mark.parametrize("whole_first", [0, 1])
def test_sync_delete_after_a_listing_that_broke_off_deletes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], whole_first: int) -> None:
    """A source listing that ends in "not found" after its first entries (a later page
    answered 404) was taken for the whole of SRC, by the copy (exit 0) and by --delete,
    which deleted the copies of the objects it had not reached. Now it is an error
    whether the copy's listing or --delete's own broke off, and nothing is deleted."""
    from memory_provider import MemProvider
    from tensorstream import register

    register("memtest", MemProvider, replace=True)
    MemProvider.store.update({f"lb/p/{k}": k.encode() for k in "abcd"})
    dst = tmp_path / "dst"
    dst.mkdir()
    for name in ("a", "b", "c", "d", "old"):
        (dst / name).write_bytes(name.encode())
    MemProvider.list_fails_after, MemProvider.whole_lists_first = 2, whole_first
    try:
        code, out, err = run(capsys, "sync", "--delete", "--json", "memtest://lb/p/", str(dst))
    finally:
        MemProvider.list_fails_after, MemProvider.whole_lists_first = None, 0
    assert code in (1, 3), err
    assert '"op": "delete"' not in out and "answered 404" in err
    assert sorted(p.name for p in dst.iterdir()) == ["a", "b", "c", "d", "old"]
    assert last_json(out)["errors"]


def test_an_overlong_url_is_clipped_in_error_lines(tmp_path: Path, http_server: Any,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A 6,000-character URL that fails was printed whole, twice in `cp`'s line
    (source and message): each long word of an error line is now clipped in the
    middle, keeping its start (scheme, host) and end (the name); --json keeps it whole."""
    url = http_server.url("missing/" + "k" * 6000 + "-end.bin")
    for argv in (["cp", url, str(tmp_path / "x.bin")], ["cat", url], ["stat", url]):
        code, _, err = run(capsys, *argv)
        assert code != 0, argv
        lines = err.splitlines()
        assert lines and all(len(x) < 1500 for x in lines), (argv, [len(x) for x in lines])
        assert "..." in err and "-end.bin" in err and "/missing/kkk" in err, (argv, err)
    code, out, _ = run(capsys, "cp", "--json", url, str(tmp_path / "x.bin"))
    assert code != 0 and url in out  # machine-readable output is not clipped
    assert not (tmp_path / "x.bin").exists()


def test_http_source_with_token(tmp_path: Path, http_token_server: Any, http_reset: None,
                                capsys: pytest.CaptureFixture[str]) -> None:
    data = os.urandom(500_000)
    http_token_server.put("cli/tok.bin", data)
    url = http_token_server.url("cli/tok.bin")
    code, _, err = run(capsys, "cp", "-q", url, str(tmp_path / "t.bin"))
    assert code == 1 and "tok-" not in err
    code, _, err = run(capsys, "cp", "-q", "--token", http_token_server.token, url,
                       str(tmp_path / "t.bin"))
    assert code == 0, err
    assert (tmp_path / "t.bin").read_bytes() == data
    assert http_token_server.token not in err


def test_python_dash_m_and_no_progress_without_tty(tmp_path: Path) -> None:
    (tmp_path / "m.bin").write_bytes(os.urandom(100_000))
    r = cli("cp", str(tmp_path / "m.bin"), str(tmp_path / "o.bin"))
    assert r.returncode == 0
    # One line per file on stdout, the one-line summary on stderr: no bar, no carriage returns.
    assert r.stdout == f"copy: {tmp_path / 'm.bin'} -> {tmp_path / 'o.bin'}\n"
    assert r.stderr.startswith("copied 1 file (97.7 KiB) in ") and r.stderr.count("\n") == 1
    assert "%|" not in r.stderr and "\r" not in r.stderr


def on_pty(*argv: str) -> str:
    """Run the CLI with stderr on a pseudo-terminal; what the terminal received."""
    proc, master = spawn_on_terminal(list(argv), columns=120)
    shown = read_to_end(master)
    assert proc.wait(timeout=60) == 0
    return shown.decode(errors="replace")


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    (tmp_path / "m.bin").write_bytes(os.urandom(1 << 20))
    shown = on_pty("cp", str(tmp_path / "m.bin"), str(tmp_path / "o.bin"))
    assert "m.bin" in shown and "100%" in shown
    assert on_pty("cp", "--quiet", str(tmp_path / "m.bin"), str(tmp_path / "o.bin")) == ""
    assert on_pty("cp", "--no-progress", str(tmp_path / "m.bin"), str(tmp_path / "o.bin")) \
        .startswith("copied 1 file (1.00 MiB) in ")


def test_progress_to_redis_ends_at_100_without_a_read_back(tmp_path: Path,
                                                           redis_server: Any) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name, size in [("big1.bin", 9 << 20), ("big2.bin", 9 << 20), ("small.bin", 1000)]:
        (src / name).write_bytes(os.urandom(size))
    shown = on_pty("cp", "-r", "--jobs", "1", str(src), redis_server.url("pty/"))
    assert "total (3 files)" in shown
    # Each chunk is checked as it is staged: no separate read-back pass to show.
    assert "verifying" not in shown
    # The last drawing of the total bar says 100%, never 98% or 102%.
    last_total = shown[shown.rindex("total (3 files)"):].split("\r")[0]
    assert "100%" in last_total and "18.0M/18.0M" in last_total, last_total
    assert "copied 3 files (18.0 MiB) in " in shown


def test_json_ends_with_a_summary_object_when_interrupted(tmp_path: Path, http_server: Any,
                                                          http_reset: None) -> None:
    """`cp --json` interrupted printed the object's line and no summary object: a reader of
    the lines could not tell the command had ended, nor what it had done."""
    key = "slow/json.bin"
    http_server.put(key, os.urandom(4 << 20))
    http_server.faults.key = key
    http_server.faults.rate_limit = 512 << 10
    dst = tmp_path / "out" / "model.bin"
    dst.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tensorstream", "cp", "--json", "--part-size",
                             "256K", "--concurrency", "2", http_server.url(key), str(dst)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: any(dst.parent.iterdir()))
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["status"] for x in lines[:-1]] == ["interrupted"]
    summary = lines[-1]
    assert summary["op"] == "summary" and summary["interrupted"] is True
    assert summary["files"] == 0 and summary["verified"] is False
    assert "no partial object was left behind" in summary["summary"]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                           (signal.SIGHUP, 129)])
def test_kill_mid_copy_then_resume(tmp_path: Path, http_server: Any, http_reset: None,
                                   sig: signal.Signals, code: int) -> None:
    data = os.urandom(4 << 20)
    key = f"slow/{sig.name}.bin"
    http_server.put(key, data)
    http_server.faults.key = key
    http_server.faults.rate_limit = 512 << 10  # per response: ~4 s at 2 parts in flight
    dst = tmp_path / "out" / "model.bin"
    dst.parent.mkdir()
    args = [sys.executable, "-m", "tensorstream", "cp", "-q", "--part-size", "256K",
            "--concurrency", "2", http_server.url(key), str(dst)]

    # 1. Without --resume: interrupted -> no destination, no temp files at all.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=signals_as_from_a_terminal)
    _wait_for(lambda: any(dst.parent.iterdir()))
    time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert f"interrupted by {sig.name}; no partial object was left behind" in err
    assert "Traceback" not in err
    assert list(dst.parent.iterdir()) == []

    # 2. With --resume: interrupted -> still no destination; a hidden partial + journal stay.
    proc = subprocess.Popen([*args, "--resume"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=signals_as_from_a_terminal)
    journal = dst.parent / ".model.bin.tensorstream-journal.tmp"
    _wait_for(journal.exists)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code
    # The message tells the truth: what was kept, and how to continue.
    assert f"interrupted by {sig.name}; kept {dst.parent / '.model.bin.tensorstream-partial.tmp'} (" \
        in err, err
    assert "of 4.00 MiB) to continue from: run the same command with --resume" in err
    assert not dst.exists()
    assert sorted(p.name for p in dst.parent.iterdir()) == [
        ".model.bin.tensorstream-journal.tmp", ".model.bin.tensorstream-partial.tmp"]

    # 3. --resume again (fast server now): completes from the journal; the parts kept
    # from the interrupted run were checked against its journal, not the source, so
    # the copy is not reported "verified".
    http_server.faults.reset()
    r = subprocess.run([*args, "--resume", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    summary = last_json(r.stdout)
    assert summary["verified"] is False and summary["bytes"] == len(data)
    assert 0 < summary["resumed_bytes"] < len(data)
    assert dst.read_bytes() == data
    assert [p.name for p in dst.parent.iterdir()] == ["model.bin"]


def test_a_hangup_is_ignored_under_nohup(tmp_path: Path, http_server: Any,
                                          http_reset: None) -> None:
    """SIGHUP (the terminal or SSH session closed) is cleaned up like SIGTERM
    (above), but a copy started with SIGHUP ignored, as ``nohup`` starts it, must
    outlive its terminal: it finishes and publishes the whole object."""
    data = os.urandom(2 << 20)
    key = "slow/nohup.bin"
    http_server.put(key, data)
    http_server.faults.key = key
    http_server.faults.rate_limit = 512 << 10  # ~2 s at 2 parts in flight
    dst = tmp_path / "out" / "model.bin"
    dst.parent.mkdir()

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "tensorstream", "cp", "-q", "--part-size",
                             "256K", "--concurrency", "2", http_server.url(key), str(dst)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=nohup)
    _wait_for(lambda: any(dst.parent.iterdir()))
    time.sleep(0.3)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert dst.read_bytes() == data
    assert [p.name for p in dst.parent.iterdir()] == ["model.bin"]


def test_resume_refuses_changed_source(tmp_path: Path, http_server: Any,
                                       http_reset: None) -> None:
    key = "slow/changed.bin"
    http_server.put(key, os.urandom(2 << 20))
    http_server.faults.key = key
    http_server.faults.rate_limit = 256 << 10
    dst = tmp_path / "model.bin"
    args = [sys.executable, "-m", "tensorstream", "cp", "-q", "--part-size", "128K",
            "--concurrency", "2", "--resume", http_server.url(key), str(dst)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for((tmp_path / ".model.bin.tensorstream-journal.tmp").exists)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    new = os.urandom(2 << 20)
    http_server.faults.reset()
    http_server.put(key, new)  # new ETag: the partial must not be reused
    r = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert last_json(r.stdout)["resumed_bytes"] == 0
    assert dst.read_bytes() == new


def _wait_for(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the copy to start")
        time.sleep(0.05)


def test_credentials_command_masks_secrets(isolated_env: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["credentials", "--s3-access-key-id", "AKIDEXAMPLE", "--s3-secret-access-key", CANARY,
            "--s3-region", "eu-west-1", "s3://bucket/model.tensors"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "AKIDEXAMPLE" in out or "eu-west-1" in out
    assert CANARY not in out + err
    code, out, err = run(capsys, *argv[:1], "--json", *argv[1:])
    assert code == 0 and CANARY not in out + err
    assert json.loads(out)


def test_interrupt_during_read_back_says_it_was_published(tmp_path: Path) -> None:
    # Only a destination whose writer takes bytes in order and says nothing of
    # them is read back after commit (S3 and Redis are checked part by part
    # before anything is published): fsspec's memory:// in the child process.
    (tmp_path / "m.bin").write_bytes(os.urandom(32 << 20))
    dst = "memory://published/m.bin"
    # One small part at a time: the read-back lasts long enough to be interrupted.
    proc, master = spawn_on_terminal(["cp", "--concurrency", "1", "--part-size", "4K",
                                      str(tmp_path / "m.bin"), dst], columns=160)
    seen = b""
    deadline = time.monotonic() + 60
    while b"verifying" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 65536)
    assert b"verifying" in seen
    proc.send_signal(signal.SIGINT)
    seen += read_to_end(master)
    assert proc.wait(timeout=30) == 130
    said = " ".join(seen.decode(errors="replace").split())
    published = (f"interrupted by SIGINT; {dst} was written completely but its verification "
                 "was interrupted: run the copy again to check it")
    # The interrupt is sometimes acted on only once the read-back has finished (a read in
    # flight is not cut short); then the object is verified and the message says so.
    finished = ("interrupted by SIGINT; 1 object(s) were copied completely before that "
                "(--resume skips them next time); no partial object was left behind")
    assert published in said or finished in said, said[-600:]
    assert "no partial object was left behind" not in said or finished in said


def test_cp_direct_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from page_cache import direct_io_at, resident_pages

    if not direct_io_at(tmp_path):
        pytest.skip("the temp directory's filesystem has no O_DIRECT")
    src = tmp_path / "src.bin"
    data = os.urandom(2 << 20)
    src.write_bytes(data)
    pages = (2 << 20) // os.sysconf("SC_PAGE_SIZE")
    for flags, resident in [((), 0), (("--no-direct",), pages), (("--no-fsync",), pages),
                            (("--no-fsync", "--direct"), 0)]:
        dst = tmp_path / ("out" + "".join(flags) + ".bin")
        code, _, err = run(capsys, "cp", "-q", *flags, str(src), str(dst))
        assert code == 0, err
        assert resident_pages(dst) == resident, flags
        assert dst.read_bytes() == data
    code, _, err = run(capsys, "cp", "--direct", "--no-direct", str(src), str(tmp_path / "x.bin"))
    assert code == 2 and "not allowed with" in err


@pytest.mark.parametrize("argv", [["cat"], ["cp", "--quiet"]], ids=["cat", "cp-to-stdout"])
def test_stdout_that_takes_part_of_the_bytes_is_a_failure(tmp_path: Path, argv: list[str]) -> None:
    """Standard output past a file size limit (RLIMIT_FSIZE): the write that reaches it takes
    part of the chunk and returns a short count. The rest was dropped and the command exited
    0 with a short copy; now the next write's error is reported and the status is 1."""
    import resource

    data = os.urandom(3 << 20)
    (tmp_path / "src.bin").write_bytes(data)
    limit = 1 << 20

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    args = [*argv, str(tmp_path / "src.bin")] + (["-"] if argv[0] == "cp" else [])
    with open(tmp_path / "out.bin", "wb") as out:
        proc = subprocess.run([sys.executable, "-m", "tensorstream", *args], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              preexec_fn=small_files)
    assert proc.returncode == 1, proc.stderr
    assert "writing standard output: File too large" in proc.stderr
    assert (tmp_path / "out.bin").read_bytes() == data[:limit]


def test_sync_delete_of_what_another_run_deleted_first_is_no_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``sync --delete`` runs at once both list an extraneous file; the second to
    delete it found it gone and failed ('no such file', exit 3: 9 of 40 rounds of 4-8
    runs). Gone is what was asked, as for S3's delete of no key. A directory where a
    file was listed is still an error."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "a.bin").write_bytes(b"a")
    for name in ("a.bin", "old.bin", "dir.bin"):
        (dst / name).write_bytes(b"old")
    real = os.unlink

    def another_run_first(path: Any, *args: Any, **kw: Any) -> None:
        if str(path).endswith("old.bin"):
            real(path)  # the other run's delete
        elif str(path).endswith("dir.bin"):
            real(path)
            os.mkdir(path)  # replaced by a directory since the listing
        real(path, *args, **kw)

    monkeypatch.setattr(os, "unlink", another_run_first)
    code, out, err = run(capsys, "sync", "--delete", "--json", str(src), str(dst))
    monkeypatch.undo()
    lines = [json.loads(line) for line in out.splitlines()]
    deletes = {os.path.basename(x["dst"] if "dst" in x else x["uri"]): x for x in lines
               if x["op"] == "delete"}
    assert deletes["old.bin"]["status"] == "deleted", lines
    assert deletes["dir.bin"]["status"] == "failed", lines
    assert code == 3 and len(last_json(out)["errors"]) == 1, err
    assert sorted(p.name for p in dst.iterdir()) == ["a.bin", "dir.bin"]
