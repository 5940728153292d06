"""Reliability: timeouts, pools, processes and memory (issue 9, cases 13-18)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from reliability_helpers import (
    FAST,
    ONE_PART,
    SMALL_PARTS,
    WAIT_OR_KILL,
    FullBacklogListener,
    open_fds,
    put_http,
    run_python,
    unique,
)
from tensorstream import _loop, errors
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.proxy import TCPFaultProxy
from tensorstream.testing.redis_server import RedisServer, redis_available

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(90)]

DATA = os.urandom(400_000)


# -- 13. stalls and timeouts ----------------------------------------------------------
async def test_stall_after_headers_times_out_then_retry_succeeds_within_deadline(
        http_server: HTTPTestServer) -> None:
    key, url = put_http(http_server, DATA)
    http_server.faults.stall_after_headers, http_server.faults.stall_times = 2, 1
    t0 = time.monotonic()
    got = await tensorstream.read_range(url, 0, len(DATA), timeout_idle=0.3, timeout_total=5,
                                        **ONE_PART)
    elapsed = time.monotonic() - t0
    assert got == DATA
    assert 0.3 <= elapsed < 5
    assert len(http_server.requests_for(key, "GET")) == 2 and http_server.faults.stalled == 1


async def test_stall_forever_gives_up_at_the_total_deadline(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    http_server.faults.stall_after_headers = 2.5  # ends soon: no handler outlives the test run
    t0 = time.monotonic()
    with pytest.raises((TimeoutError, errors.RetriesExhaustedError)) as info:
        await tensorstream.read_range(url, 0, 1000, timeout_idle=0.2, timeout_total=1.0,
                                      retries=1000, **FAST)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + 0.2 + 1.0, f"total deadline overrun: {elapsed:.2f}s"
    err = info.value
    inner = err.last_error if isinstance(err, errors.RetriesExhaustedError) else err
    assert isinstance(inner, errors.StorageTimeoutError)


@pytest.fixture
def full_backlog() -> Iterator[FullBacklogListener]:
    with FullBacklogListener() as listener:
        yield listener


def _connect_timeout_uri(kind: str, port: int) -> tuple[str, dict[str, object]]:
    if kind == "http":
        return f"http://127.0.0.1:{port}/m", {}
    if kind == "s3":
        return "s3://bucket/m", {"s3_endpoint": f"http://127.0.0.1:{port}",
                                 "s3_access_key_id": "AKIDEXAMPLE",
                                 "s3_secret_access_key": "not-a-real-secret",
                                 "s3_region": "us-east-1"}
    return f"redis://127.0.0.1:{port}/m", {}


@pytest.mark.parametrize("kind", ["http", "s3", "redis"])
async def test_listener_that_never_accepts_is_a_connect_timeout(
        full_backlog: FullBacklogListener, kind: str) -> None:
    uri, opts = _connect_timeout_uri(kind, full_backlog.port)
    t0 = time.monotonic()
    with pytest.raises((TimeoutError, errors.RetriesExhaustedError)) as info:
        await tensorstream.stat(uri, timeout_connect=0.5, retries=2, **FAST, **opts)
    elapsed = time.monotonic() - t0
    err = info.value
    inner = err.last_error if isinstance(err, errors.RetriesExhaustedError) else err
    assert isinstance(inner, TimeoutError), repr(err)
    assert elapsed < 2 * 0.5 + 3, f"connect timeout not applied: {elapsed:.2f}s"


@pytest.fixture(scope="module")
def pausable_redis() -> Iterator[RedisServer]:
    """A private server: CLIENT PAUSE would stall every other test on a shared one."""
    if not redis_available():
        pytest.skip("redis-server not installed")
    with RedisServer() as srv:
        yield srv


def test_redis_client_pause_is_a_timeout_error(pausable_redis: RedisServer) -> None:
    key = unique()
    pausable_redis.put(key, DATA)
    with tensorstream.open(pausable_redis.url(key), timeout_idle=0.3, retries=2, **FAST) as f:
        with pausable_redis.client() as admin:
            admin.execute_command("CLIENT", "PAUSE", "2500", "ALL")
        t0 = time.monotonic()
        with pytest.raises((TimeoutError, errors.RetriesExhaustedError)) as info:
            f.read()
        elapsed = time.monotonic() - t0
    err = info.value
    inner = err.last_error if isinstance(err, errors.RetriesExhaustedError) else err
    assert isinstance(inner, TimeoutError), repr(err)
    assert elapsed < 2.0
    time.sleep(max(0.0, 2.6 - elapsed))  # let the pause end before the server is reused


@pytest.mark.parametrize("kind", ["redis", "http"])
def test_an_interrupted_read_ranges_writes_nothing_after_it_raised(
        request: pytest.FixtureRequest, kind: str) -> None:
    """Ctrl-C (KeyboardInterrupt from a signal handler) at any point of ``read_ranges``:
    once it has raised, the caller's buffers are the caller's again. The requests went
    on on the I/O loop and kept landing in them (an interrupt while the call was
    handed to the loop never cancelled them at all): 11 of 21 calls before. Over
    HTTP a request cancelled twice (by the gather, then by read_ranges) stopped
    waiting for its thread, which still received into the buffer."""
    data = os.urandom(8 << 20)
    if kind == "redis":
        server: Any = request.getfixturevalue("pausable_redis")
        key = unique()
        server.put(key, data)
        url = server.url(key)
    else:
        _, url = put_http(request.getfixturevalue("http_server"), data)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    late = interrupted = 0
    try:
        with tensorstream.open(url, **FAST) as f:
            for delay in [0.001, 0.002, 0.004, 0.008, 0.016] * 4:
                bufs = [bytearray(b"\xee" * (1 << 20)) for _ in range(8)]
                signal.setitimer(signal.ITIMER_REAL, delay)
                try:
                    f.read_ranges([(i << 20, b) for i, b in enumerate(bufs)])
                except BaseException:  # the interrupt, wherever it landed
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    interrupted += 1
                    raised = [bytes(b) for b in bufs]
                    time.sleep(0.2)
                    late += any(bytes(b) != r for b, r in zip(bufs, raised, strict=True))
                signal.setitimer(signal.ITIMER_REAL, 0)
            got = bytearray(len(data))
            f.read_ranges([(0, got)])  # and the reader still reads exactly
            assert got == data
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert interrupted
    assert not late, f"{late} of {interrupted} interrupted calls wrote into a buffer afterwards"


# -- 14. a read cancelled mid-response, then the next request ---------------------------
async def test_http_read_cancelled_mid_response_then_pool_serves_right_bytes(
        http_server: HTTPTestServer) -> None:
    big = os.urandom(2 << 20)
    key_a, _ = put_http(http_server, big)
    key_b, _ = put_http(http_server, DATA)
    http_server.faults.key = key_a
    http_server.faults.rate_limit = 1 << 20  # A takes ~2 s: cancelled mid-body
    async with tensorstream.get_provider(http_server.base_url, concurrency=1,
                                         **ONE_PART) as p:
        for _ in range(3):
            task = asyncio.ensure_future(p.read_range(f"/{key_a}", 0, len(big)))
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await p.read_range(f"/{key_b}", 1000, 300_000) == DATA[1000:300_000]
            assert await p.read_range(f"/{key_b}", 0, 10) == DATA[:10]


async def test_redis_read_cancelled_mid_response_then_pool_serves_right_bytes(
        redis_server: RedisServer) -> None:
    big = os.urandom(2 << 20)
    key_a, key_b = unique(), unique()
    redis_server.put(key_a, big)
    redis_server.put(key_b, DATA)
    with TCPFaultProxy(redis_server.host, redis_server.port) as proxy:
        proxy.faults.rate_limit = 2 << 20  # replies trickle: A is cancelled mid-reply
        async with tensorstream.get_provider(f"redis://127.0.0.1:{proxy.port}/",
                                             **ONE_PART) as p:
            for i in range(3):
                task = asyncio.ensure_future(p.read_range(key_a, 0, len(big)))
                await asyncio.sleep(0.2)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                proxy.faults.rate_limit = None if i == 2 else proxy.faults.rate_limit
                got = await p.read_range(key_b, 1000, 300_000)
                assert got == DATA[1000:300_000], "a cancelled reply leaked into the next one"
                assert await p.read_range(key_b, 0, 10) == DATA[:10]


# -- 15. abandoned half-read streams ---------------------------------------------------
def test_abandoned_half_read_streams_do_not_hang_or_leak_fds(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)

    def churn(n: int) -> None:
        for _ in range(n):
            f = tensorstream.open(url, **SMALL_PARTS)
            f.read(1000)  # half-read, then dropped without close()
            del f
        gc.collect()

    churn(5)  # warm-up: loop thread, DNS cache, imports
    time.sleep(0.2)
    before = open_fds()
    t0 = time.monotonic()
    churn(100)
    time.sleep(0.5)  # connections closed by the GC finish closing on the loop
    gc.collect()
    assert time.monotonic() - t0 < 30
    grown = open_fds() - before
    assert grown <= 5, f"file descriptors grew by {grown} after 100 abandoned streams"


def test_repeated_loads_over_http_leave_no_descriptor_behind(
        http_server: HTTPTestServer) -> None:
    """Every thread that read over HTTP kept the descriptor of its
    ``/proc/thread-self/schedstat`` (read-ahead's clock) open after it ended: each
    ``safetensors.load`` of a checkpoint left five, until the process ran out."""
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    folder = unique("fdleak")
    index = {"weight_map": {}}
    for shard in range(3):
        name = f"s{shard}.safetensors"
        tensors = {f"w{shard}.{i}": torch.full((256, 256), float(i)) for i in range(4)}
        http_server.put(f"{folder}/{name}", st_torch.save(tensors))
        index["weight_map"].update(dict.fromkeys(tensors, name))
    http_server.put(f"{folder}/model.safetensors.index.json", json.dumps(index).encode())
    url = http_server.url(f"{folder}/model.safetensors.index.json")

    def churn(n: int) -> None:
        for _ in range(n):
            assert len(tensorstream.safetensors.load(url)) == 12
            assert sum(1 for _ in tensorstream.safetensors.iter_tensors(url)) == 12
        gc.collect()

    churn(2)  # warm-up: loop thread, pools, imports
    time.sleep(0.2)
    before = open_fds()
    churn(20)
    time.sleep(0.5)
    gc.collect()
    grown = open_fds() - before
    assert grown <= 5, f"file descriptors grew by {grown} after 20 loads and 20 iterations"


async def test_abandoned_half_read_async_reads_do_not_leak_fds(
        http_server: HTTPTestServer) -> None:
    big = os.urandom(1 << 20)
    key, _ = put_http(http_server, big)
    http_server.faults.key = key
    http_server.faults.rate_limit = 4 << 20
    before = open_fds()
    async with tensorstream.get_provider(http_server.base_url, concurrency=8, **FAST) as p:
        for _ in range(10):
            tasks = [asyncio.ensure_future(p.read_range(f"/{key}", 0, len(big)))
                     for _ in range(10)]
            await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.2)
    grown = open_fds() - before
    assert grown <= 3, f"file descriptors grew by {grown} after 100 cancelled reads"


# -- 16. the sync API inside running loops --------------------------------------------
async def test_sync_api_inside_a_running_event_loop_works(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    with tensorstream.open(url, **SMALL_PARTS) as f:  # the test's own loop is running
        assert f.read() == DATA
    assert asyncio.get_running_loop().is_running()


def test_sync_api_from_tensorstreams_loop_thread_raises_at_once(
        http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)

    async def misuse() -> bytes:
        with tensorstream.open(url) as f:
            return f.read()

    loop = _loop.get_loop()
    t0 = time.monotonic()
    fut = asyncio.run_coroutine_threadsafe(misuse(), loop)
    with pytest.raises(RuntimeError, match="own I/O thread"):
        fut.result(timeout=10)
    assert time.monotonic() - t0 < 5
    # The loop is still healthy afterwards.
    with tensorstream.open(url) as f:
        assert f.read(10) == DATA[:10]


def test_closing_a_reader_from_the_loop_thread_does_not_deadlock(
        http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    f = tensorstream.open(url)
    f.read(10)

    async def close_there() -> None:
        try:
            f.close()
        except RuntimeError:
            pass  # raising at once is fine; blocking forever is not

    asyncio.run_coroutine_threadsafe(close_there(), _loop.get_loop()).result(timeout=10)


# -- 17. os.fork() after use -----------------------------------------------------------
def test_fork_after_use_child_gets_a_working_tensorstream(http_server: HTTPTestServer) -> None:
    _, url = put_http(http_server, DATA)
    code = r"""
import hashlib, json, os, sys
import tensorstream
url = sys.argv[1]
with tensorstream.open(url) as f:
    parent_digest = hashlib.sha256(f.read()).hexdigest()
old = tensorstream.open(url)            # opened before fork, used after it
old.read(10)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = {}
    try:
        with tensorstream.open(url) as f:
            out["fresh"] = hashlib.sha256(f.read()).hexdigest()
        try:
            old.seek(0)
            out["inherited"] = hashlib.sha256(old.read()).hexdigest()
        except Exception as exc:        # a clear error is acceptable
            out["inherited_error"] = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:
        out["error"] = repr(exc)
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 1 << 16) or b"{}")
print(json.dumps({"parent": parent_digest, "child": child, "status": status}))
"""
    proc = run_python(code, timeout=60, args=[url])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    import hashlib

    want = hashlib.sha256(DATA).hexdigest()
    assert out["status"] == 0 and out["parent"] == want
    assert out["child"].get("fresh") == want, out
    if "inherited" in out["child"]:
        assert out["child"]["inherited"] == want
    else:
        assert out["child"]["inherited_error"]


_FORK_CODE = WAIT_OR_KILL + r"""
import json, os, sys
import tensorstream
url, opts = sys.argv[1], json.loads(sys.argv[2])
data = open(sys.argv[3], "rb").read()
MiB = 1 << 20
f = tensorstream.open(url, **opts)
assert f.read(4096) == data[:4096]      # the stream is open, or read-ahead in flight
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = {}
    try:
        out["next"] = f.read(MiB) == data[4096:4096 + MiB]
        f.seek(0)
        out["all"] = f.read() == data
        f.close()
    except BaseException as exc:
        out["error"] = repr(exc)
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
wait_or_kill(pid, 30)
child = json.loads(os.read(r, 1 << 16) or b'{"hung": true}')
parent = {"next": f.read(MiB) == data[4096:4096 + MiB]}
f.seek(0)
parent["all"] = f.read() == data
print(json.dumps({"child": child, "parent": parent}))
"""


@pytest.mark.parametrize("kind", ["stream", "ranged", "redis"])
def test_a_reader_open_across_fork_reads_exactly_in_the_child_and_the_parent(
        http_server: HTTPTestServer, tmp_path: Path, kind: str) -> None:
    """A reader open at ``os.fork()`` read by both processes: each gets its own exact
    bytes. The child's read took the parent's stream's bytes (the parent then read
    bytes of another offset as its own, silently), or waited for ever for read-ahead
    the parent's threads had in flight (Redis, HTTP ranged)."""
    data = os.urandom(8 << 20)
    src = tmp_path / "data.bin"
    src.write_bytes(data)
    opts: dict[str, Any] = {"part_size": 1 << 20}
    if kind == "redis":
        if not redis_available():
            pytest.skip("redis-server not installed")
        server = RedisServer().start()
        key = unique()
        server.put(key, data)
        url = server.url(key)
    else:
        server = None
        key, url = put_http(http_server, data)
        opts["stream_reads"] = kind == "stream"
    try:
        proc = run_python(_FORK_CODE, timeout=80, args=[url, json.dumps(opts), str(src)])
    finally:
        if server is not None:
            server.stop()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"child": {"next": True, "all": True},
                   "parent": {"next": True, "all": True}}, out


# -- 18. a large read keeps peak RSS bounded ----------------------------------------------
_RSS_CODE = r"""
import json, os, resource, sys
import tensorstream
path, size, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
buf = bytearray(chunk)
mv = memoryview(buf)
mv[:] = b"\x01" * chunk        # touch the caller's buffer first: it is not tensorstream's
base = peak()
total = 0
with tensorstream.open(path, part_size=8 << 20, concurrency=8) as f:
    while (n := f.readinto(mv)):
        assert buf.count(0, 0, 4096) == 4096 or total >= 0
        total += n
print(json.dumps({"base": base, "peak": peak(), "total": total}))
"""


@pytest.mark.timeout(180)
def test_large_local_read_with_bounded_buffer_keeps_rss_bounded(tmp_path: Path) -> None:
    size = 1 << 30  # a sparse 1 GiB file: cheap to create, real to read
    path = tmp_path / "big.bin"
    with open(path, "wb") as fh:
        fh.truncate(size)
    proc = run_python(_RSS_CODE, timeout=170, args=[str(path), str(size), str(64 << 20)])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["total"] == size
    growth = out["peak"] - out["base"]
    assert growth < 96 << 20, f"peak RSS grew by {growth >> 20} MiB reading 1 GiB"


@pytest.mark.timeout(180)
def test_large_http_copy_keeps_rss_bounded(tmp_path: Path, http_server: HTTPTestServer) -> None:
    size = 128 << 20
    key = unique()
    http_server.put(key, b"\x5a" * size)
    dst = tmp_path / "out.bin"
    code = r"""
import json, resource, sys
from tensorstream.copy.engine import copy
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
import tensorstream.providers.http.provider, tensorstream.providers.local.provider  # before baseline
base = peak()
result = copy(sys.argv[1], sys.argv[2], part_size=4 << 20, concurrency=4)
print(json.dumps({"base": base, "peak": peak(), "ok": result.ok, "bytes": result.bytes,
                  "errors": result.errors}))
"""
    try:
        proc = run_python(code, timeout=170, args=[http_server.url(key), str(dst)])
    finally:
        http_server.delete(key)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["bytes"] == size, out
    assert dst.stat().st_size == size
    growth = out["peak"] - out["base"]
    assert growth < 64 << 20, f"peak RSS grew by {growth >> 20} MiB copying 128 MiB"


@pytest.mark.parametrize("mode", ["rb", "wb"])
def test_process_exits_promptly_with_an_unclosed_stream(tmp_path: Path, mode: str) -> None:
    """An unclosed reader/writer finalised at interpreter exit must not wait on the
    (already stopped) I/O thread; an unclosed writer never publishes its object."""
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    dst = tmp_path / "dst.bin"
    code = r"""
import sys
import tensorstream
if sys.argv[1] == "rb":
    f = tensorstream.open(sys.argv[2])
    f.read(10)
else:
    f = tensorstream.open(sys.argv[3], "wb")
    f.write(b"partial")
print("done", flush=True)
"""
    proc = run_python(code, timeout=30, args=[mode, str(src), str(dst)])
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert not dst.exists()
