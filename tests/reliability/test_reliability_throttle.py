"""A server that takes only a few requests at once and throttles the rest
(``503 SlowDown``, as S3 answers a client asking too much; ``429``, as a
rate-limiting proxy does): loads and copies narrow to what it takes and
complete with exact bytes, where a fixed width failed after its retries."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from aiohttp import web

import tensorstream
from tensor_files import random_state, same_bytes, tensorizer_bytes
from tensorstream.copy.engine import copy

pytestmark = pytest.mark.usefixtures("isolated_env")

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class ThrottlingServer:
    """Serves ``objects`` (path -> bytes) with ranges, at most ``limit`` requests
    at once; any beyond get ``status`` at once. Bodies go out in 16 KiB pieces
    ``pace`` seconds apart (a slow link: requests overlap, and a client that
    does not narrow keeps meeting a full server)."""

    def __init__(self, objects: dict[str, bytes], *, limit: int, status: int = 503,
                 pace: float = 0.01) -> None:
        self.objects = objects
        self.pace = pace
        self.limit = limit
        self.status = status
        self.in_flight = 0
        self.most = 0  # the most requests served at once
        self.throttled = 0
        # Bound here and served as it is (SockSite): a port picked free and bound later
        # by the server could be taken by another process in between.
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.in_flight >= self.limit:
            self.throttled += 1
            if self.status == 503:
                return web.Response(status=503, body=SLOW_DOWN, content_type="application/xml")
            return web.Response(status=self.status, text="too many requests")
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            return await self._serve(request)
        finally:
            self.in_flight -= 1

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        data = self.objects.get(request.path)
        if data is None:
            return web.Response(status=404)
        start, stop, partial = 0, len(data), False
        if request.http_range.start is not None or request.http_range.stop is not None:
            partial = True
            start = request.http_range.start or 0
            stop = min(len(data), request.http_range.stop or len(data))
        resp = web.StreamResponse(status=206 if partial else 200)
        resp.headers["ETag"] = '"v1"'
        resp.headers["Last-Modified"] = "Thu, 01 Jan 2026 00:00:00 GMT"
        resp.headers["Accept-Ranges"] = "bytes"
        resp.headers["Content-Type"] = "application/octet-stream"
        if partial:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        resp.content_length = stop - start
        await resp.prepare(request)
        if request.method != "HEAD":
            for at in range(start, stop, 16 << 10):
                await resp.write(data[at:min(stop, at + (16 << 10))])
                await asyncio.sleep(self.pace)
        await resp.write_eof()
        return resp

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.SockSite(runner, self._sock).start())
        self._runner = runner
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> ThrottlingServer:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


S3 = {"s3_access_key_id": "AKIAEXAMPLE", "s3_secret_access_key": "secretsecretsecret",
      "s3_region": "us-east-1"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], bytes]:
    state = random_state(7, 24, (128, 256))  # 24 tensors of 128 KiB: 3 MiB
    return state, tensorizer_bytes(state, tmp_path_factory.mktemp("model"))


@pytest.fixture
def server(model: tuple[dict[str, torch.Tensor], bytes], request: pytest.FixtureRequest
           ) -> Iterator[ThrottlingServer]:
    status = getattr(request, "param", 503)
    blob = bytes(range(256)) * (16 << 10)  # 4 MiB
    with ThrottlingServer({"/b/model.tensors": model[1], "/b/blob.bin": blob},
                          limit=2, status=status) as srv:
        yield srv


@pytest.mark.parametrize("server", [503, 429], indirect=True)
@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_a_load_narrows_to_what_a_throttling_server_takes(
        server: ThrottlingServer, model: tuple[dict[str, torch.Tensor], bytes],
        scheme: str) -> None:
    state, _ = model
    if scheme == "http":
        uri, options = f"{server.url}/b/model.tensors", {}
    else:
        uri, options = "s3://b/model.tensors", {**S3, "s3_endpoint": server.url}
    # Many small reads ahead at once: wider than the server takes.
    loaded = tensorstream.deserialize(uri, device="cpu", concurrency=16,
                                      part_size=256 << 10, **options)
    assert set(loaded) == set(state)
    assert all(same_bytes(loaded[k], state[k]) for k in state)
    assert server.most <= 2
    assert server.throttled > 0  # it did throttle: the load adapted to it


@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_a_copy_narrows_to_what_a_throttling_server_takes(
        server: ThrottlingServer, tmp_path: Path, scheme: str) -> None:
    src = f"{server.url}/b/blob.bin" if scheme == "http" else "s3://b/blob.bin"
    options = {} if scheme == "http" else {**S3, "s3_endpoint": server.url}
    result = copy(src, str(tmp_path / "blob.bin"), concurrency=16, part_size=256 << 10,
                  **options)
    assert result.ok, result
    assert (tmp_path / "blob.bin").read_bytes() == server.objects["/b/blob.bin"]
    assert server.throttled > 0  # it did throttle: the copy adapted to it
    # Narrowed, not hammering: a few throttles per cut of the width, not one per part
    # and retry.
    assert server.throttled < 60
    assert server.most <= 2


def test_a_body_dropped_unread_gives_its_slot_back(server: ThrottlingServer) -> None:
    import gc

    from tensorstream.config import Timeouts
    from tensorstream.providers._http import range_get, throttle

    pool = range_get.ConnectionPool()
    gate = throttle.gate(("http", "127.0.0.1", server.port))
    body = range_get.open_range(pool, f"{server.url}/b/blob.bin", 0, 1 << 20, {}, None,
                                Timeouts())
    assert gate.in_flight == 1
    del body  # neither read to its end nor closed
    gc.collect()
    assert gate.in_flight == 0
    finished = range_get.open_range(pool, f"{server.url}/b/blob.bin", 0, 1000, {}, None,
                                    Timeouts())
    buf = bytearray(1000)
    finished.readinto(memoryview(buf))
    assert gate.in_flight == 0 and bytes(buf) == server.objects["/b/blob.bin"][:1000]
    pool.close()
