"""Reliability: ``tensorstream cp`` never writes outside its destination, is
deterministic, and leaves nothing partial behind (issue 9, cases 22-24)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from reliability_helpers import unique
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server, isolated_s3_env
from tmpfs import mounted_tmpfs

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(120)]

CLI = "import sys; from tensorstream.cli.main import main; sys.exit(main(sys.argv[1:]))"


def cp(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, "cp", "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes), symlinks excluded."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


# -- 22. traversal keys ------------------------------------------------------------------
TRAVERSAL_KEYS = ["../x", "a/../../x", "..", "/abs", "a//b", "../dst-evil/x", "./y", "c/./d"]


def test_cp_traversal_keys_never_escape_the_destination(redis_server: RedisServer,
                                                       tmp_path: Path) -> None:
    prefix = unique("trav")
    with redis_server.client() as c:
        c.set(f"{prefix}/ok/model.bin", b"fine")
        for key in TRAVERSAL_KEYS:
            c.set(f"{prefix}/{key}", b"EVIL")
        c.set(f"{prefix}-evil/x", b"SIBLING")  # a sibling prefix: not under "prefix/"
    work = tmp_path / "work"
    dst = work / "dst"
    work.mkdir()
    proc = cp("-r", redis_server.url(prefix), str(dst))
    assert proc.returncode == 3, proc.stderr  # partial: safe keys copied, others refused
    assert tree(work) == {"dst/ok/model.bin": b"fine"}
    assert not (tmp_path / "x").exists() and not (work / "x").exists()
    assert not Path("/abs").exists()
    for key in ("../x", "a/../../x", "/abs", "a//b", "../dst-evil/x"):
        assert key in proc.stderr, f"refused key {key!r} not reported: {proc.stderr}"


def test_cp_recursive_prefix_does_not_pick_up_a_sibling_prefix(redis_server: RedisServer,
                                                               tmp_path: Path) -> None:
    prefix = unique("sib")
    with redis_server.client() as c:
        c.set(f"{prefix}/a.bin", b"A")
        c.set(f"{prefix}-evil/b.bin", b"B")
        c.set(f"{prefix}evil", b"C")
    work = tmp_path / "work"
    work.mkdir()
    proc = cp("-r", redis_server.url(prefix), str(work / "dst"))
    assert proc.returncode == 0, proc.stderr
    assert tree(work) == {"dst/a.bin": b"A"}


# -- 23. a and a/b, directory markers: deterministic -----------------------------------------
def test_cp_file_and_directory_keys_and_markers_are_deterministic(
        redis_server: RedisServer, tmp_path: Path) -> None:
    prefix = unique("det")
    with redis_server.client() as c:
        for key, value in [("a", b"file-a"), ("a/b", b"file-ab"), ("d/", b""), ("d/e", b"e"),
                           ("m/", b""), ("z", b"z")]:
            c.set(f"{prefix}/{key}", value)
    results = []
    for i in range(3):
        proc = cp("-r", redis_server.url(prefix), str(tmp_path / f"run{i}"))
        errors = sorted(line for line in proc.stderr.splitlines() if "error" in line.lower())
        results.append((proc.returncode, tree(tmp_path / f"run{i}"),
                        [e.replace(f"run{i}", "RUN") for e in errors]))
    assert results[0] == results[1] == results[2]
    rc, files, _ = results[0]
    assert files.get("a/b") == b"file-ab" and files.get("d/e") == b"e" and files.get("z") == b"z"
    assert "a" not in files  # cannot be both a file and a directory: reported, not guessed
    assert rc == 3  # partial: the rest was copied


def test_cp_a_folder_marker_holding_bytes_is_reported_not_dropped(
        redis_server: RedisServer, moto_s3: MotoS3Server, tmp_path: Path) -> None:
    """``m/`` with bytes in it cannot be a file: named in an error (exit 3), never left out
    without a word (both stores dropped it silently); an empty marker stays a quiet skip."""
    prefix = unique("mark")
    objects = [("m/", b"marker bytes"), ("e/", b""), ("e/f", b"f"), ("ok", b"fine")]
    with redis_server.client() as c:
        for key, value in objects:
            c.set(f"{prefix}/{key}", value)
    for key, value in objects:
        moto_s3.put(S3_BUCKET, f"{prefix}/{key}", value)
    env = {**os.environ, **isolated_s3_env(tmp_path)}
    s3 = ["--endpoint-url", moto_s3.endpoint_url, "--s3-access-key-id", moto_s3.access_key_id,
          "--s3-secret-access-key", moto_s3.secret_access_key]
    for i, src in enumerate([redis_server.url(f"{prefix}/"), f"s3://{S3_BUCKET}/{prefix}/"]):
        dst = tmp_path / f"run{i}"
        proc = cp(*s3, "-r", src, str(dst), env=env)
        assert proc.returncode == 3, proc.stderr
        assert tree(dst) == {"e/f": b"f", "ok": b"fine"}
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and f"{prefix}/m/" in errors[0] and "12 bytes" in errors[0]


def test_cp_a_key_named_like_a_temp_file_of_cp_is_refused(redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    """A listed key ``.x.tensorstream-<hex>.tmp`` beside ``x`` would be taken for a stale temp
    file of ``x`` and removed by the next copy there (one named ``-journal.tmp`` read as a
    resume journal): refused by name, the rest copied."""
    prefix = unique("tmpname")
    with redis_server.client() as c:
        for key in ["x", ".x.tensorstream-0123456789ab.tmp", "d/.y.tensorstream-journal.tmp"]:
            c.set(f"{prefix}/{key}", b"V")
    dst = tmp_path / "dst"
    proc = cp("-r", redis_server.url(f"{prefix}/"), str(dst))
    assert proc.returncode == 3, proc.stderr
    assert tree(dst) == {"x": b"V"}
    assert proc.stderr.count("has the name of a tensorstream temp file") == 2


@pytest.mark.parametrize("resume", [False, True])
def test_cp_keys_up_to_the_longest_file_name_are_copied_longer_ones_refused(
        redis_server: RedisServer, tmp_path: Path, resume: bool) -> None:
    """A 225-255 byte name is a file name the destination takes, but the temp file beside
    it (``.NAME.tensorstream-<hex>.tmp``) was too long: every such copy failed. A segment
    past 255 bytes is refused by name before a byte is read (it failed at the rename)."""
    prefix = unique("long")
    names = ["b" * 255, "c" * 225, "\u00e9" * 127, "d" * 250 + "/f"]
    with redis_server.client() as c:
        for name in names:
            c.set(f"{prefix}/{name}", name.encode()[:9] * 300)
        c.set(f"{prefix}/{'e' * 256}", b"too long")
    dst = tmp_path / "dst"
    proc = cp("-r", *(["--resume"] if resume else []), "--part-size", "1024",
              redis_server.url(f"{prefix}/"), str(dst))
    assert proc.returncode == 3, proc.stderr
    assert tree(dst) == {name: name.encode()[:9] * 300 for name in names}
    assert proc.stderr.count("error") == 1 and "longer than 255 bytes" in proc.stderr
    assert sorted(p.name for p in dst.iterdir() if p.name.startswith(".")) == []


# -- 24. killed or out of space mid-copy ---------------------------------------------------
def _temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("part_size", ["256K", "8M"])  # many parts; one (the lane's)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_cp_killed_mid_copy_leaves_nothing_partial_and_rerun_is_verified(
        http_server: HTTPTestServer, tmp_path: Path, sig: int, part_size: str) -> None:
    data = os.urandom(3 << 20)
    key = unique()
    http_server.put(key, data)
    http_server.faults.key = key
    http_server.faults.rate_limit = 1 << 20  # ~3 s: killed part way
    dst_dir = tmp_path / "out"
    dst_dir.mkdir()
    dst = dst_dir / "model.bin"
    proc = subprocess.Popen([sys.executable, "-c", CLI, "cp", "--quiet", "--part-size", part_size,
                             "--concurrency", "2", http_server.url(key), str(dst)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not any(dst_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)  # wait until the copy has started writing
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode in (-sig, 128 + sig), (proc.returncode, err)
    assert not dst.exists(), "a partial file appeared at the final path"
    if sig != signal.SIGKILL:  # a SIGKILLed process cannot clean up; the rerun must
        assert _temp_files(dst_dir) == [], "temp files left behind"
    http_server.faults.reset()
    rerun = cp(http_server.url(key), str(dst))
    assert rerun.returncode == 0, rerun.stderr
    assert dst.read_bytes() == data


def test_cp_after_sigkill_leaves_no_stale_temp_files(http_server: HTTPTestServer,
                                                     tmp_path: Path) -> None:
    """After a SIGKILL, the next run to the same destination removes what the
    killed run left (only tensorstream's own temp names)."""
    data = os.urandom(2 << 20)
    key = unique()
    http_server.put(key, data)
    http_server.faults.key = key
    http_server.faults.rate_limit = 1 << 20
    dst_dir = tmp_path / "out"
    dst_dir.mkdir()
    (dst_dir / ".unrelated-hidden-file").write_bytes(b"keep me")
    dst = dst_dir / "model.bin"
    proc = subprocess.Popen([sys.executable, "-c", CLI, "cp", "--quiet", http_server.url(key),
                             str(dst)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while len(list(dst_dir.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.kill()
    proc.communicate(timeout=30)
    http_server.faults.reset()
    assert cp(http_server.url(key), str(dst)).returncode == 0
    assert dst.read_bytes() == data
    assert _temp_files(dst_dir) == [".unrelated-hidden-file"]


def test_cp_out_of_space_leaves_nothing_partial(tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk (EFBIG from write, like ENOSPC)."""
    src = tmp_path / "src.bin"
    data = os.urandom(4 << 20)
    src.write_bytes(data)
    dst_dir = tmp_path / "out"
    dst_dir.mkdir()
    dst = dst_dir / "copy.bin"
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
            "from tensorstream.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "cp", "--quiet", "--part-size", "256K",
                           str(src), str(dst)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "File too large" in proc.stderr or "EFBIG" in proc.stderr or "space" in proc.stderr
    assert not dst.exists() and _temp_files(dst_dir) == []
    rerun = cp(str(src), str(dst))
    assert rerun.returncode == 0 and dst.read_bytes() == data


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (a really full disk: ENOSPC); needs root."""
    yield from mounted_tmpfs(tmp_path / "tiny", "size=1m",
                             "cannot mount a tmpfs here (needs root); RLIMIT_FSIZE test covers it")


def test_cp_disk_full_leaves_nothing_partial(tiny_tmpfs: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(3 << 20)
    src.write_bytes(data)
    dst = tiny_tmpfs / "copy.bin"
    proc = cp("--part-size", "256K", str(src), str(dst))
    assert proc.returncode == 1, proc.stderr
    assert "space" in proc.stderr.lower(), proc.stderr
    assert not dst.exists() and _temp_files(tiny_tmpfs) == []
    small = tmp_path / "small.bin"
    small.write_bytes(data[:300_000])
    assert cp(str(small), str(dst)).returncode == 0  # space was given back
    assert dst.read_bytes() == data[:300_000]
