"""``timeout_idle`` on Redis's asyncio client is time without a byte, as on the
blocking one: a reply arriving steadily but taking longer than ``timeout_idle``
in all reads whole (``read_range``, ``cat``); it failed every attempt with
"Timeout reading from ...", redis.asyncio bounding each whole reply. A server
that stops mid-reply is still a stall after ``timeout_idle``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.backends import RedisBackend

pytestmark = pytest.mark.usefixtures("isolated_env")


def _slow_object(store: RedisBackend, size: int = 1 << 20) -> tuple[str, bytes]:
    key = f"slow-{uuid.uuid4().hex[:10]}.bin"
    data = os.urandom(size)
    store.put(key, data)
    store.faults.rate_limit(500_000)  # 2 s for the object, a byte every few microseconds
    return key, data


def test_read_range_of_a_reply_slower_than_timeout_idle_reads_whole(
        tensorstream_redis: RedisBackend) -> None:
    key, data = _slow_object(tensorstream_redis)
    got = asyncio.run(tensorstream.read_range(tensorstream_redis.uri(key), 0, len(data),
                                              **tensorstream_redis.options, timeout_idle=0.5,
                                              retries=1))
    assert got == data


def test_cat_of_a_reply_slower_than_timeout_idle_prints_it_whole(
        tensorstream_redis: RedisBackend) -> None:
    key, data = _slow_object(tensorstream_redis)
    env = {**os.environ, **tensorstream_redis.env, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "tensorstream", "cat",
                           tensorstream_redis.uri(key), "--timeout-idle", "0.5", "--retries", "1"],
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == data


def test_a_reply_that_stops_midway_is_still_a_stall(tensorstream_redis: RedisBackend) -> None:
    key, data = _slow_object(tensorstream_redis)
    threading.Timer(0.4, setattr, (tensorstream_redis.faults.raw, "stall", True)).start()
    started = time.monotonic()
    with pytest.raises(errors.RetriesExhaustedTimeoutError) as info:
        asyncio.run(tensorstream.read_range(tensorstream_redis.uri(key), 0, len(data),
                                            **tensorstream_redis.options, timeout_idle=0.3,
                                            retries=2, backoff_initial=0.01))
    assert time.monotonic() - started < 2.5
    assert "timeout_idle=0.3 s" in str(info.value)
