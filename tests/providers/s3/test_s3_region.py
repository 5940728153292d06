"""A bucket in another region than the configured one: S3 answers a request
signed for the wrong region with a 301 ``PermanentRedirect`` or a 400
``AuthorizationHeaderMalformed`` naming the bucket's region (a HEAD: the bare
status and ``x-amz-bucket-region``). boto3 sends the request again in that
region; so do reads here (HEAD, ranged and streamed GETs, listing), and where
that cannot help the error names the region to set. A proxy in front of moto
plays the region check: it forwards only requests signed for ``eu-west-1``."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.errors import ConfigurationError
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

_HOP = {"transfer-encoding", "connection", "keep-alive", "content-length", "content-encoding"}
BUCKET_REGION = "eu-west-1"
DATA = bytes(range(256)) * 400


def _signed_region(request: web.Request) -> str | None:
    found = re.search(r"Credential=[^/]+/\d+/([^/]+)/", request.headers.get("Authorization", ""))
    return found.group(1) if found else None


def _wrong_region_answer(kind: str, request: web.Request) -> web.Response:
    headers = {"x-amz-bucket-region": BUCKET_REGION}
    if request.method == "HEAD":  # S3 gives a HEAD no body
        return web.Response(status=301 if kind == "redirect" else 400, headers=headers)
    if kind == "redirect":
        xml = ("<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to "
               "access must be addressed using the specified endpoint.</Message></Error>")
        return web.Response(status=301, headers=headers, content_type="application/xml",
                            text=xml)
    xml = ("<Error><Code>AuthorizationHeaderMalformed</Code><Message>The authorization header "
           "is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-1'</Message>"
           f"<Region>{BUCKET_REGION}</Region></Error>")
    return web.Response(status=400, content_type="application/xml", text=xml)


class RegionProxy:
    """Forwards to moto what is signed for ``BUCKET_REGION``; answers the rest as S3
    answers a bucket in another region (``kind``: ``redirect`` or ``malformed``),
    or (``always``) answers every request that way."""

    def __init__(self, upstream: str, kind: str) -> None:
        self.upstream, self.kind = upstream, kind
        self.signed_for: list[str | None] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        region = _signed_region(request)
        self.signed_for.append(region)
        if region != BUCKET_REGION or self.kind == "always":
            return _wrong_region_answer("redirect" if self.kind == "always" else self.kind,
                                        request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with aiohttp.ClientSession(auto_decompress=False) as session, session.request(
                request.method, URL(self.upstream + request.raw_path, encoded=True),
                headers=headers, data=body, allow_redirects=False) as up:
            payload = await up.read()
            out = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
        if request.method == "HEAD":  # the object's length, not the empty body's
            out["Content-Length"] = up.headers["Content-Length"]
            return web.Response(status=up.status, headers=out)
        return web.Response(status=up.status, headers=out, body=payload)


def _serve(proxy: RegionProxy) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", proxy.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["port"], box["stop"] = runner.addresses[0][1], asyncio.Event()
        ready.set()
        await box["stop"].wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)


@pytest.fixture
def region_proxy(moto_s3: MotoS3Server, request: pytest.FixtureRequest
                 ) -> Iterator[tuple[RegionProxy, str]]:
    moto_s3.put(S3_BUCKET, "region/k.bin", DATA)
    proxy = RegionProxy(moto_s3.endpoint_url, getattr(request, "param", "redirect"))
    for endpoint in _serve(proxy):
        yield proxy, endpoint


def _options(moto_s3: MotoS3Server, endpoint: str, how: str, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Options signing for ``us-east-1``: on the client-free path (``light``), or
    through a botocore client (the region from a profile's config)."""
    options = moto_s3.options(s3_endpoint=endpoint)
    if how == "client":
        config = tmp_path / "aws-config"
        config.write_text("[default]\nregion = us-east-1\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        del options["s3_region"]
    return options


def _list(uri: str, options: dict[str, Any]) -> list[str]:
    async def go() -> list[str]:
        provider = tensorstream.get_provider(uri, **options)
        try:
            return [info.path async for info in provider.list(uri.removeprefix("s3://"))]
        finally:
            await provider.close()
    return asyncio.run(go())


READS: dict[str, Callable[[str, dict[str, Any]], Any]] = {
    "read": lambda uri, o: tensorstream.open(uri, **o).read(),
    "sequential": lambda uri, o: tensorstream.open(uri, sequential=True, **o).read(),
    "ranges": lambda uri, o: tensorstream.open(uri, part_size=4096, **o).read(),
}


@pytest.mark.parametrize("region_proxy", ["redirect", "malformed"], indirect=True)
@pytest.mark.parametrize("how", ["light", "client"])
@pytest.mark.parametrize("read", sorted(READS))
def test_a_bucket_in_another_region_is_read_in_its_region(
        region_proxy: tuple[RegionProxy, str], moto_s3: MotoS3Server, how: str, read: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, endpoint = region_proxy
    options = _options(moto_s3, endpoint, how, tmp_path, monkeypatch)
    assert READS[read](f"s3://{S3_BUCKET}/region/k.bin", options) == DATA
    # learnt once, then kept (a sequential open's first GET is dropped for the HEAD)
    first = proxy.signed_for.index(BUCKET_REGION)
    assert proxy.signed_for[:first] == ["us-east-1"] * (2 if read == "sequential" else 1)
    assert set(proxy.signed_for[first:]) == {BUCKET_REGION}


@pytest.mark.parametrize("region_proxy", ["redirect", "malformed"], indirect=True)
def test_a_listing_of_a_bucket_in_another_region_follows_it(
        region_proxy: tuple[RegionProxy, str], moto_s3: MotoS3Server) -> None:
    _, endpoint = region_proxy
    listed = _list(f"s3://{S3_BUCKET}/region/", moto_s3.options(s3_endpoint=endpoint))
    assert listed == [f"{S3_BUCKET}/region/k.bin"]


@pytest.mark.parametrize("region_proxy", ["always"], indirect=True)
@pytest.mark.parametrize("how", ["light", "client"])
def test_an_endpoint_that_serves_another_region_names_the_region_and_the_endpoint(
        region_proxy: tuple[RegionProxy, str], moto_s3: MotoS3Server, how: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Signed for the bucket's region and still redirected: the endpoint is another
    region's. One retry, then a ConfigurationError saying what to change."""
    proxy, endpoint = region_proxy
    options = _options(moto_s3, endpoint, how, tmp_path, monkeypatch)
    with pytest.raises(ConfigurationError, match=r"is in region 'eu-west-1' and requests are "
                       r"signed for it, but http://127\.0\.0\.1:\d+ answers 301 .*endpoint"):
        tensorstream.open(f"s3://{S3_BUCKET}/region/k.bin", **options).read()
    assert proxy.signed_for == ["us-east-1", BUCKET_REGION]


def test_a_redirect_that_names_no_region_says_to_set_the_buckets_region() -> None:
    from tensorstream.providers.s3.errors import ErrorContext, map_s3_http_error

    ctx = ErrorContext("b/k", "env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY", "AWS S3",
                       region="us-east-1")
    body = (b"<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to "
            b"access must be addressed using the specified endpoint.</Message></Error>")
    err = map_s3_http_error(301, {}, body, ctx)
    assert isinstance(err, ConfigurationError)
    assert "bucket 'b' is in another region" in str(err)
    assert "signed for 'us-east-1'" in str(err) and "s3_region" in str(err)
    # a 400 with the header but about something else (a HEAD of an SSE-C object in the
    # region signed for) is not a region problem
    other = map_s3_http_error(400, {"x-amz-bucket-region": "us-east-1"}, b"", ctx)
    assert "region" not in str(other)


@pytest.mark.parametrize("region", ["eu-west-1", "ap-southeast-7", "xx-unknown-1", None])
def test_reads_listings_and_writes_go_to_one_endpoint(region: str | None,
                                                      tmp_path: Path) -> None:
    """Against AWS (no endpoint set), a read's URL was botocore's presigned one, which
    names the global endpoint (``bucket.s3.amazonaws.com``) while a listing and a write
    went to the region's (``bucket.s3.REGION.amazonaws.com``): two hosts for one store,
    and the global one does not serve a bucket in an opt-in region (ap-southeast-7) or
    one botocore does not know. Every request goes where boto3 sends it now (the global
    endpoint only for us-east-1, the default). A forward proxy refusing every CONNECT
    logs the host each one was for."""
    from tensorstream.testing.forward_proxy import ForwardProxy

    options: dict[str, Any] = {"s3_access_key_id": "AKIDEXAMPLE", "s3_secret_access_key":
                               "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "retries": 1}
    if region is not None:
        options["s3_region"] = region
    uri = "s3://one-endpoint-bucket/k.bin"
    with ForwardProxy() as proxy:
        proxy.refuse_connect = 403
        options["proxy"] = proxy.url
        with pytest.raises(tensorstream.errors.TensorstreamError):
            tensorstream.open(uri, **options).read()
        with pytest.raises(tensorstream.errors.TensorstreamError):
            _list("s3://one-endpoint-bucket/", options)
        with pytest.raises(tensorstream.errors.TensorstreamError), \
                tensorstream.open(uri, "wb", **options) as w:
            w.write(b"x")
        hosts = [e.target for e in proxy.log if e.method == "CONNECT"]
    host = "s3.amazonaws.com" if region is None else f"s3.{region}.amazonaws.com"
    assert len(hosts) >= 3 and set(hosts) == {f"one-endpoint-bucket.{host}:443"}, hosts
