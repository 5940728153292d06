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
from s3_loop_front import LoopFront
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
class PagedS3(LoopFront):
    """A loopback S3 listing ``a, b`` then ``c, d`` (two pages); the second page
    stalls on its first ``stall_times`` requests (``None``: always)."""

    shutdown_timeout = 0.1

    def __init__(self, stall_times: int | None, *, then_first: list[str] | None = None,
                 trickle: bool = False) -> None:
        self.stall_times = stall_times
        self.trickle = trickle  # the first page comes a byte every 0.1 s: never idle
        self.then_first = then_first  # the first page once the second one stalled
        self.second = 0
        self.lists = 0
        self.port = 0
        super().__init__()

    @staticmethod
    def _page(keys: list[str], token: str | None) -> str:
        items = "".join(f"<Contents><Key>{k}</Key><Size>3</Size><LastModified>"
                        f"2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag></Contents>"
                        for k in keys)
        more = (f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}"
                "</NextContinuationToken>" if token else "<IsTruncated>false</IsTruncated>")
        return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name>'
                f"<KeyCount>{len(keys)}</KeyCount>{more}{items}</ListBucketResult>")

    async def _forward(self, request: web.Request) -> web.StreamResponse:
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

    def __enter__(self) -> PagedS3:  # type: ignore[override]
        self.port = int(super().__enter__().rpartition(":")[2])
        return self

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


def test_a_listing_that_changed_before_it_was_asked_again_goes_on_after_the_last_entry(
        ) -> None:
    """The neighbour: the first page, listed again, no longer ends with the entry given
    last (``b`` was deleted, ``b2`` added). S3 lists by key, so the listing goes on
    after ``b`` (asked with ``start-after``; this server lists from the start whatever it
    is asked, and the entries up to ``b`` are skipped by their order): ``b2``, ``c`` and
    ``d`` come once each, nothing is given twice, nothing after ``b`` is missed. (It
    failed, counting the entries skipped: a retry could only go on from an unchanged
    listing.)"""
    with PagedS3(stall_times=1, then_first=["a", "b2"]) as server:
        listed = _listed("s3://bkt/", **server.options, **FAST)
    assert listed == ["bkt/a", "bkt/b", "bkt/b2", "bkt/c", "bkt/d"]


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


# -- the waits between a failing listing's attempts count in timeout_total ---------------
def test_a_listing_that_keeps_failing_stops_within_timeout_total(
        tensorstream_s3: Backend) -> None:
    """Every listing request answers 503 with ``Retry-After: 0.4``: the listing tries
    at 0, 0.4 and 0.8 s, and stops there, its next wait ending past ``timeout_total=1``
    (the waits were not counted: it waited 4 x 0.4 s and failed after 5 attempts,
    with ``Retry-After: 10`` after 40 s whatever the total)."""
    folder, _ = _stored(tensorstream_s3)
    tensorstream_s3.faults.status_script([503] * 20, retry_after=0.4)
    started = time.monotonic()
    with pytest.raises(errors.RetriesExhaustedError) as info:
        _listed(tensorstream_s3.uri(folder + "/"), **tensorstream_s3.options,
                timeout_total=1.0, retries=5, backoff_max=10.0)
    assert time.monotonic() - started < 1.0
    message = str(info.value)
    assert "3 attempts" in message and "timeout_total=1 s" in message, message
    assert "--timeout-total 2" in message, message
    assert len(tensorstream_s3.faults.pending_statuses) == 20 - 3


def test_a_wait_longer_than_timeout_total_is_not_waited(tensorstream_s3: Backend) -> None:
    folder, _ = _stored(tensorstream_s3)
    tensorstream_s3.faults.status_script([503] * 5, retry_after=10.0)
    started = time.monotonic()
    with pytest.raises(errors.TensorstreamError) as info:
        _listed(tensorstream_s3.uri(folder + "/"), **tensorstream_s3.options,
                timeout_total=2.0, backoff_max=10.0)
    assert time.monotonic() - started < 2.0
    assert "listing again in 10 s would pass" in str(info.value), str(info.value)


def test_a_listing_under_timeout_total_lists_whole(tensorstream_s3: Backend) -> None:
    """Any S3 listing with ``timeout_total`` failed: "a ListObjectsV2 page larger than
    8388608 bytes" (the page's body, read under the deadline, was read whole but its
    answer left open, taken for a page cut at its limit)."""
    folder, keys = _stored(tensorstream_s3, 5)
    listed = _listed(tensorstream_s3.uri(folder + "/"), **tensorstream_s3.options,
                     timeout_total=5.0)
    assert [p.rpartition("/")[2] for p in listed] == [k.rpartition("/")[2] for k in keys]


def test_a_listing_that_recovers_within_timeout_total_lists_whole(
        tensorstream_s3: Backend) -> None:
    folder, keys = _stored(tensorstream_s3)
    tensorstream_s3.faults.status_script([503, 503], retry_after=0.3)
    listed = _listed(tensorstream_s3.uri(folder + "/"), **tensorstream_s3.options,
                     timeout_total=2.0)
    assert [p.rpartition("/")[2] for p in listed] == [k.rpartition("/")[2] for k in keys]


def test_ls_that_keeps_failing_stops_within_timeout_total(tensorstream_s3: Backend) -> None:
    folder, _ = _stored(tensorstream_s3)
    tensorstream_s3.faults.status_script([503] * 20, retry_after=3.0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **tensorstream_s3.env}
    argv = [sys.executable, "-m", "tensorstream", "ls", tensorstream_s3.uri(folder + "/"),
            "--timeout-total", "2"]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - started < 12.0  # (4 waits of 3 s before; a start-up is slow here)
    assert "--timeout-total 4" in proc.stderr, proc.stderr


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


# -- a long listing throttled now and then: resumed where it stopped -----------------------
class SortedS3(PagedS3):
    """A loopback S3 of ``keys`` listed two entries a page (``continuation-token``,
    ``start-after``, ``delimiter`` as S3 takes them: a ``start-after`` of a deeper prefix
    gives that prefix again); every ``fail_every``-th listing request is a 503."""

    def __init__(self, keys: list[str], fail_every: int) -> None:
        super().__init__(stall_times=0)
        self.keys, self.fail_every = sorted(keys), fail_every
        self.asked: list[dict[str, str]] = []

    def _entries(self, prefix: str, delimiter: str, after: str, skip_below: bool) -> list[str]:
        out: list[str] = []
        for key in self.keys:
            if not key.startswith(prefix) or key <= after:
                continue
            rest = key[len(prefix):]
            entry = prefix + rest[:rest.index(delimiter) + 1] if delimiter and \
                delimiter in rest else key
            if skip_below and after.endswith("/") and entry == after:
                continue  # (a page's token: the keys of the prefix it gave are done)
            if not out or out[-1] != entry:
                out.append(entry)
        return out

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        if q.get("list-type") != "2":
            return web.Response(status=404)
        self.asked.append(q)
        if len(self.asked) % self.fail_every == 0:
            return web.Response(status=503, text="<Error><Code>SlowDown</Code></Error>")
        token = q.get("continuation-token")
        entries = self._entries(q.get("prefix", ""), q.get("delimiter", ""),
                                token if token is not None else q.get("start-after", ""),
                                skip_below=token is not None)
        page, more = entries[:2], len(entries) > 2
        items = "".join(
            f"<CommonPrefixes><Prefix>{e}</Prefix></CommonPrefixes>" if e.endswith("/") else
            f"<Contents><Key>{e}</Key><Size>3</Size><LastModified>2026-01-01T00:00:00.000Z"
            f"</LastModified><ETag>\"e\"</ETag></Contents>" for e in page)
        tail = (f"<IsTruncated>true</IsTruncated><NextContinuationToken>{page[-1]}"
                "</NextContinuationToken>" if more else "<IsTruncated>false</IsTruncated>")
        return web.Response(text=f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
                                 f"<Name>bkt</Name>{tail}{items}</ListBucketResult>",
                            content_type="application/xml")


KEYS = [f"k{i:02d}" for i in range(24)]


def test_a_long_listing_throttled_every_few_pages_lists_whole_resuming_where_it_stopped(
        ) -> None:
    """A listing was asked again from its first page after each failure: with one page in
    four throttled (503 SlowDown), no retry got past the pages given before, and a
    listing of more than three pages failed after ``retries`` (boto3's paginator, which
    retries each page, lists it whole). Now the listing resumes after the last key given
    (``start-after``): every key once, each page asked about once more per failure."""
    with SortedS3(KEYS, fail_every=4) as server:
        listed = _listed("s3://bkt/", **server.options, **FAST, retries=3)
        asked = server.asked
    assert listed == [f"bkt/{k}" for k in KEYS]
    failures = len(asked) // 4
    assert len(asked) <= len(KEYS) // 2 + failures + 1
    resumed = [q for q in asked if "start-after" in q]  # (each a first page, no token)
    assert resumed and all("continuation-token" not in q for q in resumed)
    assert all(q["start-after"] < "k23" for q in resumed)


def test_a_resumed_level_listing_gives_a_deeper_prefix_once(tmp_path: Any) -> None:
    """The neighbour, by delimiter (``ls``): resumed after a deeper prefix, which S3 gives
    again for ``start-after`` of it, each entry still comes once, in order."""
    keys = ["a/1", "a/2", "b", "c/x", "c/y", "d", "e/z", "f", "g", "h/1", "i"]
    with SortedS3(keys, fail_every=3) as server:
        async def run() -> list[str]:
            async with tensorstream.get_provider("s3://bkt/", **server.options, **FAST,
                                                 retries=3) as p:
                return [info.path async for info in p.list_level("bkt/")]
        listed = asyncio.run(run())
    assert listed == [f"bkt/{e}" for e in ["a/", "b", "c/", "d", "e/", "f", "g", "h/", "i"]]


def test_s3_lists_after_a_key_as_a_resumed_listing_asks(tensorstream_s3: Backend) -> None:
    """What a resumed listing asks of S3 (moto): ``start_after`` a key gives the keys
    after it, by delimiter too (a deeper prefix named there comes again, and is then
    skipped by the retry layer)."""
    folder, _ = _stored(tensorstream_s3, 4)
    tensorstream_s3.put(f"{folder}/k1x/deep", b"abc")
    uri = tensorstream_s3.uri(folder + "/")
    bucket = tensorstream.parse_uri(uri).path.partition("/")[0]

    async def run() -> tuple[list[str], list[str]]:
        async with tensorstream.get_provider(uri, **tensorstream_s3.options) as p:
            base = f"{bucket}/{folder}/"
            flat = [i.path async for i in p.inner.list(base, start_after=base + "k1")]
            level = [i.path async for i in p.inner.list_level(base, start_after=base + "k1x/")]
            return flat, level
    flat, level = asyncio.run(run())
    base = f"{bucket}/{folder}/"
    assert flat == [base + k for k in ("k1x/deep", "k2", "k3")]
    assert level[-2:] == [base + "k2", base + "k3"] and base + "k1" not in level


class DirectoryBucketS3(SortedS3):
    """A directory bucket (S3 Express One Zone) listed as S3 lists one: in no order (the
    same each time) and without ``start-after`` (ignored: directory buckets have none);
    its ``fail_on``-th listing request is a 503."""

    def __init__(self, keys: list[str], fail_on: int) -> None:
        super().__init__(keys, fail_every=10**6)
        self.keys, self.fail_on = keys, fail_on  # (unsorted)

    def _entries(self, prefix: str, delimiter: str, after: str, skip_below: bool) -> list[str]:
        keys = [k for k in self.keys if k.startswith(prefix)]
        if not skip_below:  # (no token: a start-after, which a directory bucket ignores)
            return keys
        return keys[keys.index(after) + 1:]  # (a token: the key given last)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if len(self.asked) + 1 == self.fail_on:
            self.asked.append(dict(request.query))
            return web.Response(status=503, text="<Error><Code>SlowDown</Code></Error>")
        return await super()._forward(request)


@pytest.mark.parametrize("bucket", ["models--use1-az4--x-s3", "bkt"],
                         ids=["directory-bucket", "store-of-its-own-order"])
def test_a_directory_bucket_listing_retried_lists_every_key_once(bucket: str) -> None:
    """A directory bucket lists in no order and has no ``StartAfter``: a listing retried
    there was resumed with one (ignored) and every key sorting before the last one given
    was skipped as if given: ``cp -r`` left them out, ``sync --delete`` from it would
    delete them at the destination. It is listed again from its start there, the keys
    given before skipped by their count; so is a bucket of a store found listing in an
    order of its own (Storj's gateway), which failed at once ("not in S3's order")."""
    keys = ["m", "c", "x", "a", "q", "b", "z", "d"]
    with DirectoryBucketS3(keys, fail_on=3) as server:
        listed = _listed(f"s3://{bucket}/", **server.options, **FAST, retries=3)
        asked = server.asked
    assert listed == [f"{bucket}/{k}" for k in keys]
    assert not [q for q in asked if "start-after" in q]
