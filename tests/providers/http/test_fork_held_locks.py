"""A process forked while another thread was inside the HTTP(S)/S3 data plane (a load in
the background when ``multiprocessing``, a DataLoader or vLLM forks its workers):
the child has only the forking thread, so a lock another thread held at the fork
is held there for ever. The child's first read through an inherited reader, or a
fresh one, waited on it for ever; it now reads (the child's locks are new)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from reliability_helpers import FORK_WHILE_HELD, run_python
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

_CODE = FORK_WHILE_HELD + r"""
import json, os, sys, threading
import tensorstream
from tensorstream import _loop
from tensorstream.providers._http import receiver, threads, throttle
url, which, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
f = tensorstream.open(url, part_size=256 << 10, **opts)
data = f.read()
locks = {
    "local": lambda: f._provider.inner._lock,                # a local file's descriptors
    "redis width": lambda: f._provider.inner._width._cond,   # interactions running at once
    "s3 signing": lambda: f._provider.inner._sync_lock,         # the S3 signing client
    "s3 signatures": lambda: f._provider.inner._gets._lock,     # ... and its signatures
    "pool": lambda: f._provider.inner._pool._lock,           # the reader's connections
    "provider": lambda: f._provider.inner._pool_lock,        # ... and how they are made
    "throttle": lambda: throttle._lock,                      # every origin's gate
    "receiver": lambda: receiver._receiver_lock,             # the receiving thread
    "threads": lambda: threads._executor_lock,               # async callers' threads
    "loop": lambda: _loop._lock,                             # the I/O loop's start
}
def child():
    out = {}
    f.seek(0)
    out["inherited"] = f.read() == data
    with tensorstream.open(url, **opts) as g:
        out["fresh"] = g.read() == data
    import asyncio
    read = tensorstream.read_range(url, 0, 1000, **opts)
    out["async"] = asyncio.run(read) == data[:1000]
    return out
print(json.dumps(fork_while_held([locks[which]()], child)))
"""


@pytest.mark.parametrize("which", ["pool", "provider", "throttle", "receiver", "threads", "loop"])
def test_a_child_forked_while_another_thread_held_a_lock_reads(
        http_server: HTTPTestServer, which: str) -> None:
    key = f"fork-lock-{os.urandom(4).hex()}"
    http_server.put(key, os.urandom(2 << 20))
    _check(http_server.url(key), which, {})


@pytest.mark.parametrize("which", ["s3 signing", "s3 signatures", "pool"])
def test_a_child_forked_while_another_thread_held_an_s3_lock_reads(
        moto_s3: MotoS3Server, which: str) -> None:
    key = f"fork-lock-{os.urandom(4).hex()}"
    moto_s3.put(S3_BUCKET, key, os.urandom(1 << 20))
    _check(f"s3://{S3_BUCKET}/{key}", which, moto_s3.options())


@pytest.mark.parametrize("which", ["redis width"])
def test_a_child_forked_while_another_thread_held_a_redis_lock_reads(
        redis_server: RedisServer, which: str) -> None:
    key = f"fork-lock-{os.urandom(4).hex()}"
    redis_server.put(key, os.urandom(1 << 20))
    _check(redis_server.url(key), which, {})


def test_a_child_forked_while_another_thread_held_a_local_lock_reads(tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    path.write_bytes(os.urandom(1 << 20))
    _check(str(path), "local", {})


def _check(url: str, which: str, opts: dict[str, str]) -> None:
    proc = run_python(_CODE, timeout=60, args=[url, which, json.dumps(opts)])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"inherited": True, "fresh": True, "async": True}, out
