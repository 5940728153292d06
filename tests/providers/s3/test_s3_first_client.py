"""The first S3 write of a process builds its aiobotocore client off the shared
event loop: importing aiobotocore and aiohttp (and the TLS context aiohttp
builds at import) and parsing botocore's S3 model took ~1 s on that loop's
thread, and every read or load running on it stalled meanwhile.

A fresh interpreter (nothing of botocore loaded yet, as in a model server that
starts loading and then writes its first object) runs a heartbeat on the
shared loop while the writer starts; the longest gap between beats was ~1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream.testing.s3_server import MotoS3Server

_CHILD = r"""
import asyncio, json, sys, threading, time
import tensorstream
from tensorstream import _loop

uri, options = sys.argv[1], json.loads(sys.argv[2])
stop, gaps = threading.Event(), []

async def beat():
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        gaps.append(now - last)
        last = now

beating = asyncio.run_coroutine_threadsafe(beat(), _loop.get_loop())
time.sleep(0.2)
before = len(gaps)
with tensorstream.open(uri, "wb", **options) as w:
    w.write(b"first" * 1000)
stop.set()
beating.result(10)
print(json.dumps({"longest": max(gaps[before:]), "beats": len(gaps) - before,
                  "imported": "aiobotocore" in sys.modules}))
"""


def test_the_first_writer_of_a_process_leaves_the_shared_loop_running(
        moto_s3: MotoS3Server, isolated_env: Path) -> None:
    key = f"first-client/{uuid.uuid4().hex[:10]}"
    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, f"s3://{S3_BUCKET}/{key}", json.dumps(moto_s3.options())],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["imported"] and seen["beats"] > 10, seen
    assert seen["longest"] < 0.3, seen  # was ~1 s: the client built on the loop
    assert moto_s3.get(S3_BUCKET, key) == b"first" * 1000


@pytest.mark.parametrize("profile", ["missing"])
def test_a_profile_that_does_not_exist_is_still_named(
        moto_s3: MotoS3Server, isolated_env: Path, profile: str) -> None:
    """The session is built in a worker thread now: its errors still reach the
    writer mapped, naming the profile."""
    import tensorstream

    with pytest.raises(tensorstream.errors.ConfigurationError, match=profile), \
            tensorstream.open(f"s3://{S3_BUCKET}/first-client/p", "wb",
                              s3_endpoint=moto_s3.endpoint_url, s3_profile=profile) as w:
        w.write(b"x")
