"""Writes to S3 under server-side encryption, where S3's ETag is not the MD5 of the
bytes though it looks like one (SSE-KMS, SSE-C): a write must not be taken for
damaged and deleted. moto answers MD5 ETags whatever the encryption, so a proxy in
front of it answers as S3 does: the encryption header, and an ETag of 32 other hex
digits (``-N`` for a multipart object)."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream.copy.engine import CopyResult, copy
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

MiB = 1 << 20
_ETAG_XML = re.compile(rb"<ETag>(&quot;|\")?([0-9a-f]{32})(-\d+)?(&quot;|\")?</ETag>")


class EncryptingFront:
    """A reverse proxy to moto that answers every ``PUT``/``POST`` as S3 does under
    ``headers`` (e.g. ``x-amz-server-side-encryption: aws:kms``): those headers added,
    and the ETag (header, or ``<ETag>`` of a CompleteMultipartUpload) replaced by
    random hex digits of the same shape."""

    def __init__(self, upstream: str, headers: dict[str, str]) -> None:
        self.upstream, self.headers = upstream, headers
        self.methods: list[str] = []
        self._real: dict[bytes, bytes] = {}  # an ETag answered -> moto's own
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from aiohttp import ClientSession, web

        async def forward(request: web.Request) -> web.Response:
            self.methods.append(request.method)
            body = await request.read()
            for fake, real in self._real.items():  # a CompleteMultipartUpload lists parts
                body = body.replace(fake, real)
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in ("content-length", "transfer-encoding")}
            async with ClientSession(auto_decompress=False) as session, session.request(
                    request.method, self.upstream + request.raw_path, headers=headers,
                    data=body or None, allow_redirects=False) as up:
                answer = await up.read()
                out = {k: v for k, v in up.headers.items()
                       if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                            "content-encoding")}
            if request.method in ("PUT", "POST") and up.status == 200:
                out.update(self.headers)
                for name in [k for k in out if k.lower() == "etag"]:
                    fake = secrets.token_hex(16)
                    self._real[fake.encode()] = out[name].strip('"').encode()
                    out[name] = f'"{fake}"'
                answer = _ETAG_XML.sub(
                    lambda m: b"<ETag>&quot;" + secrets.token_hex(16).encode()
                    + (m.group(3) or b"") + b"&quot;</ETag>", answer)
            return web.Response(status=up.status, headers=out, body=answer)

        async def start() -> None:
            app = web.Application(client_max_size=64 * MiB)
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runner = runner

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())

    def __enter__(self) -> EncryptingFront:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def options(moto_s3: MotoS3Server) -> dict[str, Any]:
    return {**moto_s3.options(), "part_size": 5 * MiB}


def _copied(moto: MotoS3Server, options: dict[str, Any], headers: dict[str, str],
            data: bytes, tmp_path: Path) -> tuple[str, list[str], CopyResult]:
    """``data`` copied from a local file to S3 (the copy path checks what S3 answered)."""
    key = f"encrypted/{uuid.uuid4().hex}"
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    with EncryptingFront(options["s3_endpoint"], headers) as front:
        opts = {**options, "s3_endpoint": f"http://127.0.0.1:{front.port}"}
        result = copy(str(src), f"s3://{S3_BUCKET}/{key}", **opts)
        return key, front.methods, result


@pytest.mark.parametrize("headers", [
    {"x-amz-server-side-encryption": "aws:kms"},
    {"x-amz-server-side-encryption": "aws:kms:dsse"},
    {"x-amz-server-side-encryption-customer-algorithm": "AES256"},
])
@pytest.mark.parametrize("size", [1000, 11 * MiB], ids=["one PutObject", "multipart"])
def test_an_encrypted_write_is_kept_not_taken_for_damaged(
        moto_s3: MotoS3Server, options: dict[str, Any], headers: dict[str, str],
        size: int, tmp_path: Path) -> None:
    # Every such copy was compared with an ETag that is no MD5, failed as "verification
    # failed", and (one PutObject) deleted again.
    data = os.urandom(size)
    key, methods, result = _copied(moto_s3, options, headers, data, tmp_path)
    assert result.ok, result.errors
    assert moto_s3.get(S3_BUCKET, key) == data
    assert "DELETE" not in methods


@pytest.mark.parametrize("size", [1000, 11 * MiB], ids=["one PutObject", "multipart"])
@pytest.mark.parametrize("headers", [{"x-amz-server-side-encryption": "AES256"}, {}],
                         ids=["SSE-S3", "none"])
def test_an_md5_etag_that_differs_is_still_damage(
        moto_s3: MotoS3Server, options: dict[str, Any], headers: dict[str, str],
        size: int, tmp_path: Path) -> None:
    # SSE-S3 (AES256) and no encryption keep the MD5 ETag: another one is still caught
    # (this is also the test's premise: the front's ETags are not moto's).
    key, _, result = _copied(moto_s3, options, headers, os.urandom(size), tmp_path)
    assert not result.ok and "verification failed" in result.errors[0], result.errors
    assert not moto_s3.exists(S3_BUCKET, key)
