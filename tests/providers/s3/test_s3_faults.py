"""S3 faults injected by a small reverse proxy in front of moto: a body cut
mid-way is resumed, a 200 whose body is an ``<Error>`` on complete fails the
write and aborts the upload."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.testing.s3_server import MotoS3Server

MiB = 1 << 20
_HOP = {"transfer-encoding", "connection", "keep-alive", "content-length", "content-encoding"}



class Proxy:
    """Forwards every request to moto unchanged (signatures stay valid) unless
    ``fault`` returns a response of its own or asks to cut the body."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.cut_gets_after: int | None = None  # cut this many GET bodies...
        self.cut_at = 0  # ...after this many bytes
        self.error_on_complete = False
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(f"{request.method} {request.path_qs}")
        if self.error_on_complete and request.method == "POST" and "uploadId=" in request.query_string:
            return web.Response(
                status=200, content_type="application/xml",
                text="<?xml version='1.0'?><Error><Code>InternalError</Code>"
                     "<Message>We encountered an internal error.</Message></Error>",
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with aiohttp.ClientSession(auto_decompress=False) as session, session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body,
            allow_redirects=False,
        ) as up:
            payload = await up.read()
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
        if request.method == "GET" and self.cut_gets_after and up.status == 206:
            self.cut_gets_after -= 1
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[: self.cut_at])
            assert request.transport is not None
            request.transport.close()  # the connection drops mid-body
            return resp
        return web.Response(status=up.status, headers=out_headers, body=payload)


@pytest.fixture
async def proxy(moto_s3: MotoS3Server, isolated_env: Path) -> AsyncIterator[tuple[Proxy, str]]:
    p = Proxy(moto_s3.endpoint_url)
    app = web.Application(client_max_size=64 * MiB)
    app.router.add_route("*", "/{tail:.*}", p.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield p, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_body_cut_midway_is_resumed_exactly(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    p, endpoint = proxy
    key = f"faults/cut-{uuid.uuid4().hex[:8]}"
    data = os.urandom(3 * MiB)
    moto_s3.put(S3_BUCKET, key, data)
    p.cut_gets_after, p.cut_at = 2, 100_000
    opts = moto_s3.options(s3_endpoint=endpoint, backoff_initial=0.01)
    provider = tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts)
    async with provider:
        got = await provider.read_range(f"{S3_BUCKET}/{key}", 10, len(data))
        assert got == data[10:]
        assert provider.metrics.resumed_bytes == 2 * 100_000
    # the resumed requests started where the cut ones stopped, pinned to nothing else
    assert sum("GET" in s for s in p.seen) == 3


async def test_body_cut_on_every_attempt_is_an_error(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    p, endpoint = proxy
    key = f"faults/cut-always-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, key, os.urandom(1 * MiB))
    p.cut_gets_after, p.cut_at = 100, 1000
    opts = moto_s3.options(s3_endpoint=endpoint, backoff_initial=0.01, retries=3)
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/{key}", 0, 1 * MiB, **opts)
    assert isinstance(info.value.last_error, errors.IncompleteReadError)


async def test_complete_answered_200_with_error_body_fails_and_aborts(
    proxy: tuple[Proxy, str], moto_s3: MotoS3Server
) -> None:
    p, endpoint = proxy
    p.error_on_complete = True
    key = f"faults/complete-{uuid.uuid4().hex[:8]}"
    opts = moto_s3.options(s3_endpoint=endpoint, part_size=5 * MiB)
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts) as provider:
        writer = provider.open_writer(f"{S3_BUCKET}/{key}")
        await writer.write(os.urandom(11 * MiB))
        with pytest.raises(errors.ServiceUnavailableError, match="InternalError"):
            await writer.commit()
    assert not moto_s3.exists(S3_BUCKET, key)
    assert moto_s3.open_multipart_uploads(S3_BUCKET, key) == []
    assert any(s.startswith("DELETE") and "uploadId=" in s for s in p.seen)  # aborted
