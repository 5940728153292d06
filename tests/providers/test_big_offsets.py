"""Offsets past 2**31 and 2**32 bytes through every front door, on a sparse
5 GiB file (no disk: only three 1 MiB marks hold data): a local path, the same
file over HTTP and as an S3 object (nginx answering path-style ranged GETs and
HEADs), and as a Redis manifest of 1 MiB chunks of which only those near the
marks are stored (a real redis-server; chunk keys past 2**32), read with
``open``/``read_range``/``stat`` and ``tensorstream cat --range``. Only a few
MiB are read, near the big offsets."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream.providers.redis.layout import chunk_key, manifest_fields
from tensorstream.testing.redis_server import RedisServer

MiB = 1 << 20
SIZE = (5 << 30) + 3  # odd: the last part is short
MARKS = {(1 << 31) - MiB // 2: os.urandom(MiB), (1 << 32) - MiB // 2: os.urandom(MiB),
         SIZE - MiB: os.urandom(MiB)}
HAVE_NGINX = shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()
# Ranges that cross 2**31, 2**32, and end at the last byte.
RANGES = [((1 << 31) - 100, (1 << 31) + 100), ((1 << 32) - 3 * MiB // 4, (1 << 32) + MiB // 4),
          (SIZE - 3 * MiB // 2, SIZE), (SIZE - 1, SIZE)]


def expected(start: int, end: int) -> bytes:
    out = bytearray(end - start)
    for at, data in MARKS.items():
        lo, hi = max(start, at), min(end, at + len(data))
        if lo < hi:
            out[lo - start:hi - start] = data[lo - at:hi - at]
    return bytes(out)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("big")
    (root / "b").mkdir()
    with open(root / "b" / "big.bin", "wb") as f:
        f.truncate(SIZE)
        for at, data in MARKS.items():
            f.seek(at)
            f.write(data)
    return root


@pytest.fixture(scope="module")
def nginx(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not HAVE_NGINX:
        pytest.skip("needs Debian's nginx")
    from benchmarks import servers

    with servers.start_nginx(root, tmp_path_factory.mktemp("nginx"), workers=1) as srv:
        yield srv.url


def _s3(nginx: str) -> dict[str, Any]:
    return {"s3_endpoint": nginx, "s3_access_key_id": "AKIAEXAMPLE",
            "s3_secret_access_key": "x" * 40, "s3_region": "us-east-1"}


def _check_front_doors(uri: str, options: dict[str, Any]) -> None:
    assert asyncio.run(tensorstream.stat(uri, **options)).size == SIZE
    for start, end in RANGES:
        assert asyncio.run(tensorstream.read_range(uri, start, end, **options)) == \
            expected(start, end), (start, end)
    with tensorstream.open(uri, **options) as f:
        assert f.seek(0, os.SEEK_END) == SIZE
        for start, end in RANGES:
            f.seek(start)
            assert f.read(end - start) == expected(start, end), (start, end)
            f.seek(start)
            buf = bytearray(end - start)
            assert f.readinto(buf) == end - start and bytes(buf) == expected(start, end)
        assert f.read() == b""  # at the end
        f.seek(SIZE - 10)
        assert f.read(100) == expected(SIZE - 10, SIZE)  # short only at the end
    with pytest.raises(tensorstream.errors.InvalidRangeError):
        asyncio.run(tensorstream.read_range(uri, SIZE - 1, SIZE + 1, **options))


def _cat(uri: str, byte_range: str, env: dict[str, str] | None = None) -> bytes:
    r = subprocess.run([sys.executable, "-m", "tensorstream", "cat", "--range", byte_range, uri],
                       capture_output=True, timeout=120, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def test_a_local_file_past_four_gib(root: Path) -> None:
    _check_front_doors(str(root / "b" / "big.bin"), {})
    _check_front_doors(f"file://{root}/b/big.bin", {})


def test_cat_range_past_four_gib(root: Path) -> None:
    path = str(root / "b" / "big.bin")
    start = (1 << 32) - 5
    assert _cat(path, f"{start}-{start + 9}") == expected(start, start + 10)
    assert _cat(path, "-64") == expected(SIZE - 64, SIZE)
    assert _cat(path, f"{SIZE - 7}-") == expected(SIZE - 7, SIZE)


def test_http_past_four_gib(nginx: str) -> None:
    _check_front_doors(f"{nginx}/b/big.bin", {})
    assert _cat(f"{nginx}/b/big.bin", f"{(1 << 31) - 1}-{1 << 31}") == \
        expected((1 << 31) - 1, (1 << 31) + 1)


def test_s3_past_four_gib(nginx: str, isolated_env: Path) -> None:
    _check_front_doors("s3://b/big.bin", _s3(nginx))


def test_redis_chunks_past_four_gib(redis_server: RedisServer) -> None:
    gen = "0123456789abcdef"
    with redis_server.client() as c:
        c.hset("big", mapping=manifest_fields(size=SIZE, chunk_size=MiB, generation=gen,
                                              checksum="sha256:" + "0" * 64, mtime=time.time()))
        chunks = {at - at % MiB + k * MiB for at in MARKS for k in (-1, 0, 1, 2)}
        for start in sorted(chunks):
            if 0 <= start < SIZE:
                c.set(chunk_key("big", gen, start), expected(start, min(start + MiB, SIZE)))
    _check_front_doors(redis_server.url("big"), {})
    assert _cat(redis_server.url("big"), f"{(1 << 32) - 2}-{(1 << 32) + 1}") == \
        expected((1 << 32) - 2, (1 << 32) + 2)
