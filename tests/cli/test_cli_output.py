"""What ``tensorstream cp``/``ls``/``cat`` print: ``--json`` lines, ``--quiet``, a closed
pipe, escaped names, ``ls`` sizes and summaries, and the errors that name what is wrong
(a missing bucket or object, TLS); the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli_env import cli, s3_env

S3_BUCKET = "tensorstream-tests"


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


def test_debug_output_escapes_names_in_its_log_lines_and_traceback(tmp_path: Path) -> None:
    # --debug printed its log records and the error's traceback raw: a key or a server's
    # text holding terminal escape sequences repainted the screen there.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "d\x1b[2Jx").write_bytes(b"x")
    missing = str(tmp_path / "m\x1b]0;title\x07x")
    r = cli("--debug", "stat", missing)
    assert r.returncode == 1 and "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "Traceback (most recent call last):" in r.stderr.splitlines()  # still lines
    assert "m\\x1b]0;title\\x07x" in r.stderr
    r = cli("--debug", "ls", "-l", str(tmp_path / "src"))
    assert r.returncode == 0 and "\x1b" not in r.stdout + r.stderr, r.stderr[-500:]
