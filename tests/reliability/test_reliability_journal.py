"""Reliability: a ``--resume`` journal that makes no sense is ignored (issue 15, class 5).

The journal of an interrupted ``cp`` is a file in the destination directory: anyone can
edit it, a crash can cut it. Part numbers outside the object, negative or non-numeric,
digests that are not sha256 hex, or a journal of the wrong shape must mean "start over",
never a raw Python error or a claim that bytes were copied. A sensible journal is still
used (the baseline below proves the test reaches the journal)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorstream.copy.engine import copy
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(120)]

PART = 1 << 20
DATA = os.urandom(5 * PART + 77)
SHA0 = hashlib.sha256(DATA[:PART]).hexdigest()


def _seed(http_server: HTTPTestServer, dst: Path, parts: Any) -> str:
    """An interrupted run's leftovers: the partial file (first part right) and a journal."""
    key = "journal-src.bin"
    http_server.put(key, DATA)
    url = http_server.url(key)
    partial = dst.parent / f".{dst.name}.tensorstream-partial.tmp"
    partial.write_bytes(DATA[:PART] + bytes(len(DATA) - PART))
    identity = {"v": 1, "source": url, "size": len(DATA), "etag": http_server.etag(key),
                "part_size": PART}
    journal = dst.parent / f".{dst.name}.tensorstream-journal.tmp"
    journal.write_text(json.dumps({"identity": identity, "parts": parts}))
    return url


def test_a_sensible_journal_is_used(http_server: HTTPTestServer, tmp_path: Path) -> None:
    dst = tmp_path / "m.bin"
    url = _seed(http_server, dst, {"0": SHA0})
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == PART  # the journal was read and its part reused
    assert dst.read_bytes() == DATA
    # ... but that part was compared with the journal only, never with the source
    assert not result.verified and not result.outcomes[0].verified


def test_a_journal_that_lies_consistently_is_never_called_verified(
        http_server: HTTPTestServer, tmp_path: Path) -> None:
    dst = tmp_path / "m.bin"
    forged = bytes(PART)  # zeros where the source has other bytes ...
    url = _seed(http_server, dst, {"0": hashlib.sha256(forged).hexdigest()})
    partial = tmp_path / f".{dst.name}.tensorstream-partial.tmp"
    partial.write_bytes(forged + bytes(len(DATA) - PART))  # ... and a journal agreeing
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.resumed_bytes == PART
    assert not result.verified, "bytes never compared with the source were called verified"


@pytest.mark.parametrize("parts", [
    {"99999999999999999999": SHA0}, {"6": SHA0}, {"-1": SHA0}, {"abc": SHA0}, {"1.5": SHA0},
    {"0": "not-a-digest"}, {"0": 5}, {"0": SHA0.upper()}, {"0": None}, {" 0": SHA0},
    [0, 1], "0", None, {"0": SHA0, "5000000": SHA0},
], ids=repr)
def test_a_journal_that_makes_no_sense_is_ignored(http_server: HTTPTestServer, tmp_path: Path,
                                                  parts: Any) -> None:
    dst = tmp_path / "m.bin"
    url = _seed(http_server, dst, parts)
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == 0  # nothing taken from the journal
    assert dst.read_bytes() == DATA
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".m.bin")) == []


# -- what else may sit under the names of cp's state files ---------------------------------
CLI = "import sys; from tensorstream.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _plant(where: Path, kind: str, outside: Path) -> None:
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "symlink":
        where.symlink_to(outside)
    elif kind == "directory":
        where.mkdir()
        (where / "keep").write_bytes(b"someone's")


@pytest.mark.parametrize(("name", "kind", "resume"), [
    ("journal", "fifo", True), ("journal", "symlink", True),
    ("partial", "fifo", True), ("partial", "symlink", True), ("partial", "fifo", False),
    ("partial", "directory", False), ("journal.new", "fifo", True),
    ("journal.new", "symlink", True), ("0123456789ab", "fifo", False),
    ("0123456789ab", "directory", False),
])
def test_a_fifo_link_or_directory_under_a_state_file_name_never_blocks_or_redirects(
        tmp_path: Path, name: str, kind: str, resume: bool) -> None:
    """Names cp uses beside its destination (``.m.tensorstream-*.tmp``) holding a FIFO (an
    open would wait for a writer, in a thread no signal stops), a symlink or a directory:
    the copy starts over in a fresh file, leaves the link's target and the directory alone,
    and finishes with the exact bytes."""
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    outside = tmp_path / "outside"
    _plant(dst_dir / f".m.tensorstream-{name}.tmp", kind, outside)
    if name != "journal":  # a journal (claiming part 0) beside the planted file
        (dst_dir / ".m.tensorstream-journal.tmp").write_text(json.dumps({"parts": {"0": SHA0}}))
    proc = subprocess.run(
        [sys.executable, "-c", CLI, "cp", "--quiet", "--part-size", str(PART),
         *(["--resume"] if resume else []), str(src), str(dst_dir / "m")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (dst_dir / "m").read_bytes() == DATA
    assert not outside.exists()
    planted = dst_dir / f".m.tensorstream-{name}.tmp"
    if kind == "directory":
        assert (planted / "keep").read_bytes() == b"someone's"


def test_a_directory_under_the_partial_name_is_named_by_a_resumed_copy(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    (dst_dir / ".m.tensorstream-partial.tmp").mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", CLI, "cp", "--quiet", "--resume", str(src), str(dst_dir / "m")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert ".m.tensorstream-partial.tmp in the destination is a directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr
    assert not (dst_dir / "m").exists()


@pytest.mark.parametrize("text", [b"[" * 200_000, b'{"parts":' * 200_000, b"", b"\xff\xfe\x00",
                                  b'{"identity": {"v": 1}, "parts": {"0": "', b"null", b"1e999"],
                         ids=["deep-array", "deep-object", "empty", "binary", "cut", "null",
                              "huge-number"])
def test_a_journal_that_is_not_json_is_ignored(http_server: HTTPTestServer, tmp_path: Path,
                                               text: bytes) -> None:
    """Nested past the parser's recursion limit, a journal raised RecursionError (not a
    ValueError): the copy failed with 'maximum recursion depth exceeded' instead of
    starting over."""
    dst = tmp_path / "m.bin"
    url = _seed(http_server, dst, {"0": SHA0})
    (tmp_path / f".{dst.name}.tensorstream-journal.tmp").write_bytes(text)
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == 0 and dst.read_bytes() == DATA


@pytest.mark.parametrize("journal", [False, True])
def test_a_resumed_copy_never_touches_the_partial_file_a_live_run_holds(
        tmp_path: Path, journal: bool) -> None:
    """Another ``cp --resume`` into the same destination holds the partial file (its lock).
    Starting over truncated that file under the live run (O_TRUNC before the lock), which
    then published zeros where its parts had been; now the second run says the file is in
    use and leaves it alone."""
    import fcntl

    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    partial = dst_dir / ".m.tensorstream-partial.tmp"
    partial.write_bytes(DATA[:PART] + bytes(len(DATA) - PART))
    if journal:
        (dst_dir / ".m.tensorstream-journal.tmp").write_text(json.dumps({"parts": {"0": SHA0}}))
    with open(partial, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.run(
            [sys.executable, "-c", CLI, "cp", "--quiet", "--resume", "--part-size", str(PART),
             str(src), str(dst_dir / "m")], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1
        assert "is in use: another tensorstream copy to this destination is running" \
            in proc.stderr
        assert partial.read_bytes() == DATA[:PART] + bytes(len(DATA) - PART)
    assert not (dst_dir / "m").exists()


@pytest.mark.parametrize("cmd", [["cp"], ["sync"]])
def test_a_copy_without_resume_leaves_the_partial_file_a_live_run_holds(
        tmp_path: Path, cmd: list[str]) -> None:
    """``cp``/``sync`` without --resume discard what an interrupted --resume run left, but
    they removed a *live* run's partial file and journal too: that run's final rename then
    found nothing, or, once a third --resume run had started a partial under the name,
    published its half-written file (zeros where parts were missing). A held partial is
    now left to the run holding it; this copy still publishes its own."""
    import fcntl

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    (src_dir / "m").write_bytes(DATA)
    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    partial = dst_dir / ".m.tensorstream-partial.tmp"
    partial.write_bytes(DATA[:PART] + bytes(len(DATA) - PART))
    journal = dst_dir / ".m.tensorstream-journal.tmp"
    journal.write_text(json.dumps({"parts": {"0": SHA0}}))
    source = str(src_dir / "m") if cmd == ["cp"] else str(src_dir)
    with open(partial, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.run([sys.executable, "-c", CLI, *cmd, "--quiet", source,
                               str(dst_dir) + "/"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert partial.read_bytes() == DATA[:PART] + bytes(len(DATA) - PART)
        assert json.loads(journal.read_text()) == {"parts": {"0": SHA0}}
    assert (dst_dir / "m").read_bytes() == DATA
    # Not held: an earlier run's leftovers are discarded as before.
    proc = subprocess.run([sys.executable, "-c", CLI, "cp", "--quiet", str(src_dir / "m"),
                           str(dst_dir) + "/"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dst_dir.iterdir()) == ["m"]


def test_a_weak_etag_never_lets_a_resumed_copy_splice_two_versions(tmp_path: Path) -> None:
    """A weak ETag (``W/"v1"``) says "equivalent", not "the same bytes": a server may keep
    it while the bytes change. A journal of such a source matched the new version, its
    old parts were kept and the copy published old bytes spliced with new ones. Such a
    source now starts over, as a source without an ETag does."""
    from reliability_helpers import RawHTTPServer

    new = bytes(reversed(DATA))
    size = len(new)

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        validators = 'ETag: W/"v1"\r\nLast-Modified: Tue, 01 Dec 2026 08:00:00 GMT\r\n'
        if method == "HEAD":
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n{validators}"
            return (head + "Accept-Ranges: bytes\r\nConnection: close\r\n\r\n").encode()
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        a, b = int(first), min(int(last) if last else size - 1, size - 1)
        head = (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{size}\r\n"
                f"Content-Length: {b - a + 1}\r\n{validators}Connection: close\r\n\r\n")
        return head.encode() + new[a:b + 1]

    dst = tmp_path / "m.bin"
    with RawHTTPServer(respond) as server:
        url = server.url("m.bin")
        # What a run interrupted on the earlier version left: its first part and journal.
        (tmp_path / ".m.bin.tensorstream-partial.tmp").write_bytes(
            DATA[:PART] + bytes(size - PART))
        identity = {"v": 1, "source": url, "size": size, "etag": 'W/"v1"', "part_size": PART}
        (tmp_path / ".m.bin.tensorstream-journal.tmp").write_text(
            json.dumps({"identity": identity, "parts": {"0": SHA0}}))
        result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == 0
    assert dst.read_bytes() == new


def test_a_partial_file_hard_linked_to_a_file_outside_is_never_written_through(
        http_server: HTTPTestServer, tmp_path: Path) -> None:
    """The partial file's name is a hard link to a file outside the destination, beside a
    journal that fits the source (O_NOFOLLOW stops symlinks, not hard links): the resumed
    copy wrote the source's missing parts into that file and published it under the
    destination's name, still linked outside. Now such a partial is not resumed: only its
    name is removed and the copy starts over in a fresh file."""
    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    dst = dst_dir / "m.bin"
    url = _seed(http_server, dst, {"0": SHA0})
    partial = dst_dir / ".m.bin.tensorstream-partial.tmp"
    outside = tmp_path / "precious.db"
    before = partial.read_bytes()
    partial.rename(outside)
    os.link(outside, partial)
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == 0 and dst.read_bytes() == DATA
    assert outside.read_bytes() == before and os.stat(outside).st_nlink == 1
