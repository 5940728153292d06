"""The guarantees of the layers, against real servers: deadlines inside an
attempt (a trickling server, a stalling provider) and version pinning (a
server without ETags, a server whose HEAD and GET disagree, an answer whose
total size is not the size the read was opened with), on the async, blocking
and streamed paths and in ``cp``."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.config import Timeouts
from tensorstream.layers import timeout as timeout_layer
from tensorstream.providers._http.range_get import ConnectionPool, open_range
from tensorstream.providers.base import Pin, current_deadline, report_progress
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20
#: Reads by ranged requests only, on the blocking data path (worker threads).
RANGED = {"stream_reads": False, "part_size": 256 << 10, "readahead": MiB}
PATHS = ["async", "blocking", "streamed"]


#: A well-behaved http_server, its faults reset before and after each test.
pytestmark = pytest.mark.usefixtures("http_server", "http_reset")


def _put(server: HTTPTestServer, size: int, *, old: bool = False) -> tuple[str, str, bytes]:
    key = f"layers-{os.urandom(4).hex()}"
    data = os.urandom(size)
    # ``old``: a Last-Modified well in the past, so a replacement gets another one
    # (HTTP dates count whole seconds).
    server.put(key, data, mtime=time.time() - 100 if old else None)
    return key, server.url(key), data


def _read_all(url: str, path: str, **options: Any) -> bytes:
    """Read a whole object on one of the three read paths: async reads of 1 MiB
    pinned to a stat (as ``cp`` and ``cat`` do), a file object reading by
    ranged requests on worker threads, or one reading a streamed request."""
    if path == "async":
        return asyncio.run(_read_async(url, **options))
    extra = RANGED if path == "blocking" else {"stream_reads": True}
    with tensorstream.open(url, **{**extra, **options}) as f:
        return f.read()


async def _read_async(url: str, **options: Any) -> bytes:
    path = tensorstream.parse_uri(url).path
    async with tensorstream.get_provider(url, **options) as p:
        info = await p.stat(path)
        out = bytearray(info.size)
        for pos in range(0, info.size, MiB):
            view = memoryview(out)[pos : pos + MiB]
            await p.readinto(path, pos, view, pin=Pin.of(info))
        return bytes(out)


# -- deadlines inside an attempt ----------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_a_trickling_server_is_cut_at_the_total_deadline(
        http_server: HTTPTestServer, path: str) -> None:
    key, url, _ = _put(http_server, 4096)
    http_server.faults.key = key
    http_server.faults.rate_limit = 5  # one byte every 0.2 s: never idle, never done
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _read_all(url, path, timeout_total=1.0, timeout_idle=5, retries=3)
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("path", PATHS)
def test_a_stall_is_cut_at_the_idle_timeout_and_retried(
        http_server: HTTPTestServer, path: str) -> None:
    key, url, data = _put(http_server, 300_000)
    http_server.faults.key = key
    http_server.faults.stall_after_headers, http_server.faults.stall_times = 30.0, 1
    started = time.monotonic()
    assert _read_all(url, path, timeout_idle=0.5, backoff_initial=0.01) == data
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("path", PATHS)
def test_deadlines_hold_when_bodies_are_received_by_the_shared_receiver(
        http_server: HTTPTestServer, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same two deadlines with every body handed to the one receiving thread
    (as the read-ahead engine's are)."""
    from tensorstream.providers._http import receiver

    monkeypatch.setattr(receiver, "SHARED_DEFAULT", True)
    test_a_trickling_server_is_cut_at_the_total_deadline(http_server, path)
    http_server.faults.reset()
    test_a_stall_is_cut_at_the_idle_timeout_and_retried(http_server, path)


class _StallingProvider(tensorstream.Provider):
    """A provider that ignores every deadline: its reads sleep."""

    schemes = ("stall",)
    service = "stall"
    sleep = 6.0

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> _StallingProvider:
        return cls()

    async def stat(self, path: str) -> tensorstream.ObjectInfo:
        return tensorstream.ObjectInfo(path=path, size=10, etag='"v1"')

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        await asyncio.sleep(self.sleep)
        buffer[:] = b"x" * len(buffer)
        return len(buffer)


@pytest.fixture
def stall_scheme() -> Iterator[str]:
    tensorstream.register("stall", _StallingProvider, replace=True)
    yield "stall://host/obj"


@pytest.mark.parametrize("options", [{"timeout_total": 1.0},
                                     {"timeout_idle": 1.0, "retries": 1}])
async def test_a_provider_that_ignores_deadlines_is_cut_off_by_the_layer(
        stall_scheme: str, options: dict[str, Any]) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await tensorstream.read_range(stall_scheme, 0, 10, **options)
    assert time.monotonic() - started < 2.5


class _BusyProvider(tensorstream.Provider):
    """A provider whose first read answers busy with a ``retry_after`` that is
    no number of seconds (a third-party provider's parse of ``Retry-After``)."""

    schemes = ("busy",)
    service = "busy"
    retry_after = float("nan")
    calls = 0

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> _BusyProvider:
        return cls()

    async def stat(self, path: str) -> tensorstream.ObjectInfo:
        return tensorstream.ObjectInfo(path=path, size=10, etag='"v1"')

    capabilities = tensorstream.Capabilities(blocking_reads=True)

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        return self.readinto_blocking(path, offset, buffer, pin=pin)

    def readinto_blocking(self, path: str, offset: int, buffer: memoryview, *,
                          pin: Pin | None = None) -> int:
        type(self).calls += 1
        if type(self).calls == 1:
            raise errors.ServiceUnavailableError("busy", retry_after=type(self).retry_after)
        buffer[:] = b"x" * len(buffer)
        return len(buffer)


@pytest.mark.parametrize("path_kind", ["async", "blocking"])
@pytest.mark.parametrize("retry_after", [float("nan"), float("inf"), float("-inf")])
def test_a_retry_after_that_is_no_number_waits_the_backoff(
        retry_after: float, path_kind: str) -> None:
    tensorstream.register("busy", _BusyProvider, replace=True)
    _BusyProvider.calls, _BusyProvider.retry_after = 0, retry_after
    buf = bytearray(10)

    async def read() -> None:
        async with tensorstream.get_provider("busy://host/obj", backoff_max=0.2) as p:
            if path_kind == "async":
                await p.readinto("obj", 0, memoryview(buf))
            else:
                await asyncio.to_thread(p.readinto_blocking, "obj", 0, memoryview(buf))

    started = time.monotonic()
    asyncio.run(read())
    assert buf == b"x" * 10
    assert _BusyProvider.calls == 2 and time.monotonic() - started < 2


class _ScriptedProvider(_BusyProvider):
    """Each read takes the next error of ``script`` (None: it succeeds)."""

    schemes = ("scripted",)
    script: list[BaseException | None] = []

    def readinto_blocking(self, path: str, offset: int, buffer: memoryview, *,
                          pin: Pin | None = None) -> int:
        type(self).calls += 1
        failure = type(self).script.pop(0) if type(self).script else None
        if failure is not None:
            raise failure
        buffer[:] = b"y" * len(buffer)
        return len(buffer)


def _scripted_read(path_kind: str, script: list[BaseException | None],
                   **options: Any) -> tuple[bytearray, Any, float]:
    tensorstream.register("scripted", _ScriptedProvider, replace=True)
    _ScriptedProvider.calls, _ScriptedProvider.script = 0, list(script)
    buf = bytearray(10)
    metrics: Any = None

    async def read() -> None:
        nonlocal metrics
        async with tensorstream.get_provider("scripted://host/obj", **options) as p:
            metrics = p.metrics
            if path_kind == "async":
                await p.readinto("obj", 0, memoryview(buf))
            else:
                await asyncio.to_thread(p.readinto_blocking, "obj", 0, memoryview(buf))

    started = time.monotonic()
    try:
        asyncio.run(read())
    finally:
        elapsed = time.monotonic() - started
    return buf, metrics, elapsed


@pytest.mark.parametrize("path_kind", ["async", "blocking"])
def test_a_first_attempt_that_fails_is_retried_as_the_loop_would(path_kind: str) -> None:
    # The first attempt runs outside the retry loop; its temporary failure must still
    # be waited on (the server's Retry-After), counted and retried.
    busy = errors.ServiceUnavailableError("busy", retry_after=0.4)
    buf, metrics, elapsed = _scripted_read(path_kind, [busy], backoff_max=5)
    assert buf == b"y" * 10
    assert _ScriptedProvider.calls == 2
    assert elapsed >= 0.4
    assert metrics.retries == 1
    assert metrics.requests == 4  # the stat before, two reads, the stat after (no pins)


@pytest.mark.parametrize("path_kind", ["async", "blocking"])
def test_a_first_attempt_that_fails_for_good_is_not_retried(path_kind: str) -> None:
    with pytest.raises(errors.NotFoundError) as info:
        _scripted_read(path_kind, [errors.NotFoundError("gone")])
    assert _ScriptedProvider.calls == 1
    assert info.value.operation == "read" and info.value.service == "busy"  # context added


@pytest.mark.parametrize("path_kind", ["async", "blocking"])
def test_every_attempt_failing_ends_in_retries_exhausted(path_kind: str) -> None:
    busy = [errors.ServiceUnavailableError("busy", retry_after=0.0) for _ in range(3)]
    with pytest.raises(errors.RetriesExhaustedError, match="3 attempts"):
        _scripted_read(path_kind, busy, retries=3, backoff_max=0.01)
    assert _ScriptedProvider.calls == 3
    with pytest.raises(errors.ServiceUnavailableError):  # one attempt: no retry at all
        _scripted_read(path_kind, busy[:1], retries=1)
    assert _ScriptedProvider.calls == 1


async def test_progress_reports_keep_a_long_read_alive() -> None:
    """The idle watchdog measures silence, not the length of a read."""
    async def slow_but_alive() -> int:
        for _ in range(8):
            await asyncio.sleep(0.1)
            report_progress()
        return 8

    t = Timeouts(idle=0.3)
    assert await timeout_layer.run_async(slow_but_alive, t, None) == 8
    with pytest.raises(errors.StorageTimeoutError, match="timeout_idle"):
        await timeout_layer.run_async(lambda: asyncio.sleep(2), t, None)


async def test_an_outside_cancellation_is_not_taken_for_a_timeout() -> None:
    t = Timeouts(idle=5, total=5)
    task = asyncio.ensure_future(timeout_layer.run_async(
        lambda: asyncio.sleep(10), t, timeout_layer.operation_deadline(t)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_an_operation_bounds_the_calls_inside_it() -> None:
    with timeout_layer.operation(Timeouts(total=1.0)):
        outer = current_deadline()
        assert outer is not None and outer.at is not None
        # A call inside with a longer budget still ends with the operation.
        assert timeout_layer.operation_deadline(Timeouts(total=60)) == outer.at
    assert current_deadline() is None


# -- pinning ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_without_etags_a_replaced_object_is_never_mixed(
        http_server: HTTPTestServer, path: str) -> None:
    """Last-Modified only: reads send If-Unmodified-Since and compare each
    answer's Last-Modified; the server here also ignores the condition."""
    key, url, data = _put(http_server, 3 * MiB, old=True)
    f = http_server.faults
    f.key, f.no_etag = key, True
    f.replace_after_requests = 1  # every GET after the first sees a new version
    f.ignore_if_unmodified_since = True
    f.drop_after, f.drop_times = 200_000, 1  # and the first body is cut (a resume)
    with pytest.raises(errors.ObjectChangedError):
        got = _read_all(url, path, part_size=MiB, backoff_initial=0.01)
        pytest.fail(f"read {len(got)} bytes, {sum(a != b for a, b in zip(got, data, strict=True))} "
                    "of them from the new version")
    gets = http_server.requests_for(key, "GET")
    assert any("If-Unmodified-Since" in r.headers for r in gets)
    assert not any("If-Match" in r.headers for r in gets)


def test_without_etags_the_server_refuses_another_version(http_server: HTTPTestServer) -> None:
    key, url, data = _put(http_server, 3 * MiB, old=True)
    http_server.faults.key, http_server.faults.no_etag = key, True
    with tensorstream.open(url, **RANGED) as f:
        assert f.read(10) == data[:10]
        http_server.put(key, b"y" * len(data))  # same size, a newer Last-Modified
        with pytest.raises(errors.ObjectChangedError):
            f.read()
    assert 412 in [r.status for r in http_server.requests_for(key, "GET")]


@pytest.mark.parametrize("path", PATHS)
def test_etag_on_head_only_and_if_match_ignored_is_never_mixed(
        http_server: HTTPTestServer, path: str) -> None:
    """HEAD and GET disagree: the pin comes from HEAD's ETag, the GETs carry no
    validator at all and the server ignores If-Match; each answer is confirmed
    after its body, so a replacement is still an error."""
    key, url, _data = _put(http_server, 3 * MiB, old=True)
    f = http_server.faults
    f.key, f.etag_on_head_only, f.no_last_modified, f.ignore_if_match = key, True, True, True
    f.replace_after_requests = 1
    f.drop_after, f.drop_times = 200_000, 1  # the first body is cut: a resume
    with pytest.raises(errors.ObjectChangedError):
        _read_all(url, path, part_size=MiB)


@pytest.mark.parametrize("path", PATHS)
def test_etag_on_head_only_reads_an_unchanged_object(
        http_server: HTTPTestServer, path: str) -> None:
    key, url, data = _put(http_server, 3 * MiB)
    f = http_server.faults
    f.key, f.etag_on_head_only, f.no_last_modified = key, True, True
    assert _read_all(url, path, part_size=MiB) == data


def test_an_answer_whose_total_is_not_the_pinned_size_is_a_change(
        http_server: HTTPTestServer) -> None:
    """The 2000-byte object read as the 1000-byte one it was: the answer's
    Content-Range total betrays it even without any validator."""
    key, url, _data = _put(http_server, 2000)
    f = http_server.faults
    f.key, f.no_etag, f.no_last_modified = key, True, True
    pool = ConnectionPool()
    t = Timeouts()
    with pytest.raises(errors.ObjectChangedError, match="size 2000, was 1000"):
        open_range(pool, url, 0, 500, {}, Pin(size=1000), t)
    assert open_range(pool, url, 0, 4, {}, Pin(size=2000), t).readinto(
        memoryview(bytearray(4))) == 4


def test_cp_of_an_object_without_etag_replaced_mid_copy_fails(
        http_server: HTTPTestServer, tmp_path: Any) -> None:
    from tensorstream.copy import copy

    key, url, _data = _put(http_server, 3 * MiB, old=True)
    f = http_server.faults
    f.key, f.no_etag, f.ignore_if_unmodified_since = key, True, True
    f.replace_after_requests = 1
    f.drop_after, f.drop_times = 100_000, 1
    result = copy(url, str(tmp_path / "out.bin"), part_size=MiB, backoff_initial=0.01)
    assert not result.ok and not result.files
    assert "changed while it was being read" in " ".join(result.errors)
    assert not (tmp_path / "out.bin").exists()
