"""A listing is retried as reads are: a page that stalls (or is throttled) once is
asked for again and the listing goes on, each entry given once (``ls``, ``cp -r``,
``sync`` and ``PolicyProvider.list``, S3 and Redis).

Before, one stalled ``ListObjectsV2`` page or ``SCAN`` failed the whole listing at
once ("s3 list bkt/: timed out after 0 bytes"): listings were never retried, though
listing is idempotent (boto3's paginator retries each page, as every read).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

import tensorstream
from tensorstream import errors
from tensorstream.testing.backends import Backend

pytestmark = pytest.mark.usefixtures("isolated_env")

FAST = {"timeout_idle": 0.3, "backoff_initial": 0.01, "backoff_max": 0.05}


def _listed(uri: str, **options: Any) -> list[str]:
    async def run() -> list[str]:
        async with tensorstream.get_provider(uri, **options) as p:
            return [info.path async for info in p.list(tensorstream.parse_uri(uri).path)]
    return asyncio.run(run())


def _stored(store: Backend, n: int = 3) -> tuple[str, list[str]]:
    folder = f"list-{uuid.uuid4().hex[:8]}"
    keys = [f"{folder}/k{i}" for i in range(n)]
    for key in keys:
        store.put(key, b"abc")
    return folder, keys


# -- S3 (moto behind the fault proxy) ---------------------------------------------------
@pytest.mark.parametrize("fault", ["stall", "503"])
def test_an_s3_listing_page_that_fails_once_is_asked_again(
        tensorstream_s3: Backend, fault: str) -> None:
    folder, keys = _stored(tensorstream_s3)
    if fault == "503":
        tensorstream_s3.faults.status_script([503])
    else:
        stalls = []

        async def stall_once(method: str, path: str) -> None:
            if method == "GET" and not stalls and path.rstrip("/").count("/") == 1:
                stalls.append(path)  # (the bucket's own path: a listing)
                await asyncio.sleep(2.0)

        tensorstream_s3.faults.raw.before_forward = stall_once
    listed = _listed(tensorstream_s3.uri(folder + "/"), **tensorstream_s3.options, **FAST)
    assert [p.rpartition("/")[2] for p in listed] == [k.rpartition("/")[2] for k in keys]


# -- a listing of several pages whose second page stalls ------------------------------------
class PagedS3:
    """A loopback S3 listing ``a, b`` then ``c, d`` (two pages); the second page
    stalls on its first ``stall_times`` requests (``None``: always)."""

    def __init__(self, stall_times: int | None, *, then_first: list[str] | None = None,
                 trickle: bool = False) -> None:
        self.stall_times = stall_times
        self.trickle = trickle  # the first page comes a byte every 0.1 s: never idle
        self.then_first = then_first  # the first page once the second one stalled
        self.second = 0
        self.lists = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @staticmethod
    def _page(keys: list[str], token: str | None) -> str:
        items = "".join(f"<Contents><Key>{k}</Key><Size>3</Size><LastModified>"
                        f"2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag></Contents>"
                        for k in keys)
        more = (f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}"
                "</NextContinuationToken>" if token else "<IsTruncated>false</IsTruncated>")
        return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name>'
                f"<KeyCount>{len(keys)}</KeyCount>{more}{items}</ListBucketResult>")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("list-type") != "2":
            return web.Response(status=404)
        self.lists += 1
        if request.query.get("continuation-token") == "t1":
            self.second += 1
            if self.stall_times is None or self.second <= self.stall_times:
                await asyncio.sleep(3.0)
            return web.Response(text=self._page(["c", "d"], None), content_type="application/xml")
        first = self.then_first if self.then_first and self.second else ["a", "b"]
        if self.trickle:
            body = self._page(first, "t1").encode()
            resp = web.StreamResponse(headers={"Content-Type": "application/xml",
                                               "Content-Length": str(len(body))})
            await resp.prepare(request)
            for byte in body:
                await resp.write(bytes([byte]))
                await asyncio.sleep(0.1)
            return resp
        return web.Response(text=self._page(first, "t1"), content_type="application/xml")

    def __enter__(self) -> PagedS3:
        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.port = runner.addresses[0][1]
            return runner

        self._thread.start()
        self._runner = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def options(self) -> dict[str, Any]:
        return {"s3_endpoint": f"http://127.0.0.1:{self.port}", "s3_region": "us-east-1",
                "s3_access_key_id": "AKIDEXAMPLE", "s3_secret_access_key": "not-a-secret"}


@pytest.fixture
def paged_once() -> Iterator[PagedS3]:
    with PagedS3(stall_times=1) as server:
        yield server


def test_a_stalled_second_page_is_asked_again_and_no_entry_comes_twice(
        paged_once: PagedS3) -> None:
    assert _listed("s3://bkt/", **paged_once.options, **FAST) == ["bkt/a", "bkt/b", "bkt/c",
                                                                  "bkt/d"]
    assert paged_once.second == 2


def test_ls_of_a_listing_whose_page_stalls_once_prints_every_key_once(
        paged_once: PagedS3) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "tensorstream", "ls", "s3://bkt/", "--timeout-idle", "0.3",
            "--endpoint-url", f"http://127.0.0.1:{paged_once.port}", "--region", "us-east-1"]
    env.update(AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="not-a-secret")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[-1] for line in proc.stdout.splitlines()] == ["a", "b", "c", "d"]


def test_a_page_that_always_stalls_fails_after_the_retries_naming_timeout_idle() -> None:
    with PagedS3(stall_times=None) as server:
        started = time.monotonic()
        with pytest.raises(errors.RetriesExhaustedTimeoutError) as info:
            _listed("s3://bkt/", **server.options, **FAST, retries=3)
        assert time.monotonic() - started < 3.0
        assert server.second == 3
    assert "timeout_idle=0.3 s" in str(info.value) and "3 attempts" in str(info.value)


def test_a_listing_that_changed_before_it_was_asked_again_fails_instead_of_mixing() -> None:
    """The neighbour: the first page, listed again, no longer ends with the entry given
    last (``b`` was deleted, ``b2`` added): the listing fails with the stall that
    stopped it, and gives neither ``b2`` nor ``c`` (an entry missed or given twice)."""
    with PagedS3(stall_times=1, then_first=["a", "b2"]) as server:
        got: list[str] = []

        async def run() -> None:
            async with tensorstream.get_provider("s3://bkt/", **server.options, **FAST) as p:
                async for info in p.list("bkt/"):
                    got.append(info.path)

        with pytest.raises(errors.StorageTimeoutError) as info:
            asyncio.run(run())
    assert got == ["bkt/a", "bkt/b"]
    assert "timeout_idle=0.3 s" in str(info.value) and "had changed" in str(info.value)


def test_a_trickling_listing_page_stops_at_timeout_total() -> None:
    """A page sent a byte every 0.1 s is never idle: ``timeout_total`` bounds each
    page's request (``ls --timeout-total``), as it bounds each read; it was not
    applied to listings, and such an ``ls`` ran for as long as the server trickled."""
    with PagedS3(stall_times=0, trickle=True) as server:
        started = time.monotonic()
        with pytest.raises(errors.StorageTimeoutError) as info:
            _listed("s3://bkt/", **server.options, **FAST, timeout_total=1.0)
        assert time.monotonic() - started < 3.0
    assert "timeout_total=1 s" in str(info.value), str(info.value)


# -- Redis --------------------------------------------------------------------------------
def test_a_redis_listing_that_stalls_once_is_asked_again(tensorstream_redis: Backend) -> None:
    folder, keys = _stored(tensorstream_redis)
    tensorstream_redis.faults.raw.stall = True

    def release() -> None:
        tensorstream_redis.faults.raw.stall = False

    timer = threading.Timer(0.5, release)
    timer.start()
    try:
        listed = _listed(tensorstream_redis.uri(folder + "/"), **tensorstream_redis.options,
                         **FAST, retries=8)
    finally:
        timer.cancel()
    assert [p.rpartition("/")[2] for p in listed] == [k.rpartition("/")[2] for k in keys]
