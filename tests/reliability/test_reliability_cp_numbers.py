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

from fixtures_s3 import S3_BUCKET
from reliability_helpers import RawHTTPServer, unique
from tensorstream.copy.engine import copy
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

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


def test_a_head_claiming_absurd_sizes_to_s3_fails_without_exhausting_memory(
        moto_s3_public: MotoS3Server) -> None:
    key = unique("liar")
    opts = moto_s3_public.options()
    with _liar(10**18) as server:
        out = _cli("cp", "--endpoint-url", str(opts["s3_endpoint"]), "--no-sign-request",
                   server.url("model.tensors"), f"s3://{S3_BUCKET}/{key}")
    assert out.returncode != 0, out
    assert "MemoryError" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    listing = moto_s3_public.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=key)
    assert listing.get("KeyCount") == 0
    uploads = moto_s3_public.client.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=key)
    assert not uploads.get("Uploads")


@pytest.mark.parametrize("to", ["local", "s3"])
def test_a_damaged_redis_chunk_fails_verification_against_the_stored_sha256(
        redis_server: RedisServer, moto_s3_public: MotoS3Server, tmp_path: Path,
        to: str) -> None:
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
    if to == "local":
        result = copy(redis_server.url(key), str(tmp_path / "m.bin"))
    else:
        result = copy(redis_server.url(key), f"s3://{S3_BUCKET}/{key}",
                      **moto_s3_public.options())
    assert not result.ok, result
    assert any("sha256" in e or "verification" in e for e in result.errors), result.errors
    assert not (tmp_path / "m.bin").exists()
    if to == "s3":
        listing = moto_s3_public.client.list_objects_v2(Bucket=S3_BUCKET, Prefix=key)
        assert listing.get("KeyCount") == 0, "a damaged object was published"
