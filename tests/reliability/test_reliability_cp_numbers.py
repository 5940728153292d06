"""Reliability: ``cp`` does not trust the sizes and checksums a source reports (issue 15,
class 5, the copy side).

A HEAD claiming 10**18 bytes must not make ``cp`` plan 10**11 parts: the destination's
free space is checked first and parts are planned lazily. The CLI runs in a child process
with a 1.5 GiB address-space limit, so a regression fails the test instead of exhausting
the machine. A Redis object whose chunks were damaged under an intact manifest fails the
copy's verification against the sha256 the manifest stored."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from reliability_helpers import RawHTTPServer, unique
from tensorstream.copy.engine import copy
from tensorstream.testing.redis_server import RedisServer

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(180)]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *args], capture_output=True,
                          text=True, timeout=120, preexec_fn=_limit_memory)


def _liar(size: int) -> RawHTTPServer:
    """A server whose HEAD claims ``size`` bytes; it holds 1000."""
    def respond(method: str, headers: dict[str, str], _attempt: int) -> bytes:
        if method == "HEAD":
            return (f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nETag: \"v1\"\r\n"
                    "Accept-Ranges: bytes\r\n\r\n").encode()
        return (b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */1000\r\n"
                b"Content-Length: 0\r\n\r\n")
    return RawHTTPServer(respond)


@pytest.mark.parametrize("size", [10**18, 1 << 50])
def test_a_head_claiming_absurd_sizes_fails_fast_without_exhausting_memory(
        tmp_path: Path, size: int) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    with _liar(size) as server:
        out = _cli("cp", server.url("model.tensors"), str(dest / "model.tensors"))
    assert out.returncode != 0, out
    assert "MemoryError" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "space" in out.stderr, out.stderr
    assert list(dest.iterdir()) == []


def test_a_damaged_redis_chunk_fails_verification_against_the_stored_sha256(
        redis_server: RedisServer, tmp_path: Path) -> None:
    import tensorstream

    key = unique("model")
    data = bytes(range(256)) * 64  # 16 KiB in 4 KiB chunks
    with tensorstream.open(redis_server.url(key), "wb", redis_chunk_size=4 << 10) as f:
        f.write(data)
    with redis_server.client() as c:
        chunk = next(k for k in c.scan_iter(match=f"{key}:*") if k.endswith(b":4096"))
        value = bytearray(c.get(chunk))
        value[7] ^= 0xFF
        c.set(chunk, bytes(value))  # the manifest (and its sha256) is left as it was
    result = copy(redis_server.url(key), str(tmp_path / "m.bin"))
    assert not result.ok, result
    assert any("sha256" in e or "verification" in e for e in result.errors), result.errors
    assert not (tmp_path / "m.bin").exists()
