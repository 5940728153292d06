"""S3 through a real forward proxy on loopback: the data plane's reads and
botocore's/aiobotocore's listings and writes take the same route (the proxy
option, or the environment with one ``NO_PROXY`` reading), plain and TLS."""

from __future__ import annotations

import asyncio
import os
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.cli.main import main
from tensorstream.testing.forward_proxy import ForwardProxy
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env")

MiB = 1 << 20
USER, PASSWORD = "s3-proxy-user-4", "s3-proxy-pw-canary-8"
DATA = os.urandom(11 * MiB + 333)


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with ForwardProxy(user=USER, password=PASSWORD) as server:
        yield server


@pytest.fixture(params=["plain", "tls"])
def s3(request: pytest.FixtureRequest, moto_s3: MotoS3Server,
       moto_s3_tls: MotoS3Server) -> MotoS3Server:
    return moto_s3 if request.param == "plain" else moto_s3_tls


def _listed(uri: str, **options: object) -> list[str]:
    async def run() -> list[str]:
        async with tensorstream.get_provider(uri, **options) as provider:
            return [info.path async for info in provider.list(uri[len("s3://"):])]
    return asyncio.run(run())


@pytest.mark.parametrize("how", ["option", "env"])
def test_writes_reads_and_listings_go_through_the_proxy(
        s3: MotoS3Server, proxy: ForwardProxy, how: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    options = s3.options(part_size=5 * MiB)
    if how == "option":
        options["proxy"] = proxy.url_with(USER, PASSWORD)
    else:
        monkeypatch.setenv("HTTPS_PROXY" if s3.tls else "HTTP_PROXY",
                           proxy.url_with(USER, PASSWORD))
    prefix = f"proxied-{uuid.uuid4().hex[:8]}/"
    uri = f"s3://{S3_BUCKET}/{prefix}model.bin"
    with tensorstream.open(uri, "wb", **options) as w:  # multipart, through aiobotocore
        w.write(DATA)
    with tensorstream.open(uri, "rb", **options) as r:  # the data plane
        assert r.read() == DATA
    assert _listed(f"s3://{S3_BUCKET}/{prefix}", **options) == [f"{S3_BUCKET}/{prefix}model.bin"]
    assert s3.get(S3_BUCKET, f"{prefix}model.bin") == DATA
    assert all(e.authorized for e in proxy.log)
    if s3.tls:
        assert {e.method for e in proxy.log} == {"CONNECT"}
    else:  # every kind of request went through it: upload parts, ranged GETs, the listing
        methods = {e.method for e in proxy.log}
        assert {"POST", "PUT", "GET"} <= methods
        assert any("list-type=2" in e.target for e in proxy.log)


@pytest.mark.parametrize("variable, no_proxy, through", [
    # botocore on its own matches no CIDR entry (urllib's rules): its writes went
    # through the proxy while the data plane's reads went direct
    ("HTTP_PROXY", "10.0.0.0/8,127.0.0.0/8", False),
    # botocore on its own reads no ALL_PROXY: its writes went direct
    ("ALL_PROXY", "", True),
])
def test_botocore_and_the_data_plane_take_one_route(
        moto_s3: MotoS3Server, proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch,
        variable: str, no_proxy: str, through: bool) -> None:
    monkeypatch.setenv(variable, proxy.url_with(USER, PASSWORD))
    monkeypatch.setenv("NO_PROXY", no_proxy)
    key = f"route-{uuid.uuid4().hex[:8]}.bin"
    with tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", **moto_s3.options()) as w:
        w.write(DATA[:MiB])
    with tensorstream.open(f"s3://{S3_BUCKET}/{key}", "rb", **moto_s3.options()) as r:
        assert r.read() == DATA[:MiB]
    methods = {e.method for e in proxy.log if key in e.target}
    assert ({"PUT", "GET"} <= methods) if through else not methods, methods


def test_proxy_false_keeps_botocore_off_the_environments_proxy(
        moto_s3: MotoS3Server, proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url_with(USER, PASSWORD))
    options = moto_s3.options(proxy=False)
    prefix = f"direct-{uuid.uuid4().hex[:8]}/"
    with tensorstream.open(f"s3://{S3_BUCKET}/{prefix}a.bin", "wb", **options) as w:
        w.write(DATA[:MiB])
    with tensorstream.open(f"s3://{S3_BUCKET}/{prefix}a.bin", "rb", **options) as r:
        assert r.read() == DATA[:MiB]
    assert _listed(f"s3://{S3_BUCKET}/{prefix}", **options) == [f"{S3_BUCKET}/{prefix}a.bin"]
    assert proxy.log == []


def test_a_407_to_a_write_names_the_proxy_never_the_password(
        s3: MotoS3Server, proxy: ForwardProxy) -> None:
    key = f"refused-{uuid.uuid4().hex[:8]}.bin"
    options = s3.options(proxy=proxy.url_with(USER, "wrong-pw-canary-5"), retries=3,
                         backoff_initial=0.01)
    with pytest.raises(errors.ConnectionFailedError) as info:
        with tensorstream.open(f"s3://{S3_BUCKET}/{key}", "wb", **options) as w:
            w.write(b"x" * 100)
    said = "".join(traceback.format_exception(info.value)) + repr(info.value)
    assert f"the proxy 127.0.0.1:{proxy.port} (from argument proxy) refused" in said
    assert "407" in said and "refused the user and password" in said
    assert "wrong-pw-canary-5" not in said and USER not in said
    assert not info.value.temporary
    assert not s3.exists(S3_BUCKET, key)


def test_cp_from_s3_goes_through_the_proxy(moto_s3: MotoS3Server, proxy: ForwardProxy,
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    key = f"cp-{uuid.uuid4().hex[:8]}.bin"
    moto_s3.put(S3_BUCKET, key, DATA)
    for name, value in moto_s3.options().items():
        env = {"s3_endpoint": "AWS_ENDPOINT_URL", "s3_access_key_id": "AWS_ACCESS_KEY_ID",
               "s3_secret_access_key": "AWS_SECRET_ACCESS_KEY", "s3_region": "AWS_REGION"}
        monkeypatch.setenv(env[name], value)
    monkeypatch.setenv("http_proxy", proxy.url_with(USER, PASSWORD))
    assert main(["cp", f"s3://{S3_BUCKET}/{key}", str(tmp_path / "out.bin")]) == 0
    assert (tmp_path / "out.bin").read_bytes() == DATA
    assert any(e.method == "GET" and key in e.target for e in proxy.log)
    assert PASSWORD not in capsys.readouterr().err


def test_botocores_own_listing_goes_through_the_proxy_and_a_407_says_so(
        moto_s3_tls: MotoS3Server, proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CA from AWS_CA_BUNDLE (botocore's trust store): listings take botocore's
    # own client (urllib3, its CONNECT), not the data plane. Its 407 was "cannot
    # reach ... (ProxyConnectionError)", temporary, naming no status.
    options = moto_s3_tls.options()
    monkeypatch.setenv("AWS_CA_BUNDLE", options.pop("ca_bundle"))
    prefix = f"botolist-{uuid.uuid4().hex[:8]}/"
    moto_s3_tls.put(S3_BUCKET, f"{prefix}a.bin", b"a" * 100)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url_with(USER, PASSWORD))
    assert _listed(f"s3://{S3_BUCKET}/{prefix}", **options) == [f"{S3_BUCKET}/{prefix}a.bin"]
    assert proxy.log and {e.method for e in proxy.log} == {"CONNECT"}
    proxy.clear_log()
    monkeypatch.setenv("HTTPS_PROXY", proxy.url_with(USER, "wrong-pw-canary-6"))
    with pytest.raises(errors.ConnectionFailedError) as info:
        _listed(f"s3://{S3_BUCKET}/{prefix}", **options, retries=3, backoff_initial=0.01)
    said = "".join(traceback.format_exception(info.value)) + repr(info.value)
    assert f"the proxy 127.0.0.1:{proxy.port} (from HTTPS_PROXY) refused" in said
    assert "407" in said and "wrong-pw-canary-6" not in said and USER not in said
    assert not info.value.temporary
    assert len(proxy.log) == 1
