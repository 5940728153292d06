"""Round trips before the first tensor byte of an HTTP load: every request to
an object store pays its time-to-first-byte (20-50 ms), so each one the load
makes before the stream from byte 0 delays every tensor. The load's first
request is one ``GET`` from byte 0 to the end: its answer gives the size and
validators (no ``HEAD``) and its body the header, the index and the first
tensors. A ``HEAD``, a separate read of the header or index, or a probe would
add a sequential round trip. A reader that asks for a few ranges (a filtered or
lazy load, a plain ``open``) keeps the ``HEAD`` and never asks for every byte."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.proxy import HTTPFaultProxy
from tensorstream.testing.s3_server import MotoS3Server

torch = pytest.importorskip("torch")
tensorizer = pytest.importorskip("tensorizer")

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    gen = torch.Generator().manual_seed(1)
    state = {f"layer.{i}.weight": torch.randn(256, 512, generator=gen) for i in range(8)}
    path = Path(tmp_path_factory.mktemp("roundtrips")) / "model.tensors"
    serializer = tensorizer.TensorSerializer(str(path))
    serializer.write_state_dict(state)
    serializer.close()
    return path.read_bytes()


def _range(headers: object) -> str | None:
    return dict(headers).get("Range")  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize("how", ["open", "deserialize"])
def test_the_first_request_is_the_stream_from_byte_zero(
        how: str, blob: bytes, http_server: HTTPTestServer) -> None:
    key = f"rt-{uuid.uuid4().hex[:8]}.tensors"
    http_server.put(key, blob)
    url = http_server.url(key)
    if how == "open":
        with tensorstream.open(url, sequential=True, **http_server.options) as f:
            d = tensorizer.TensorDeserializer(f, device="cpu")
            assert len(d) == 8
            d.close()
    else:
        with tensorstream.deserialize(url, device="cpu", **http_server.options) as d:
            assert len(d) == 8
    seen = http_server.requests_for(key)
    assert seen, "no request"
    first = seen[0]
    assert first.method == "GET", [(r.method, _range(r.headers)) for r in seen]
    # From byte 0 to the end: header, index and the first tensors share one
    # time-to-first-byte.
    assert _range(first.headers) in ("bytes=0-", f"bytes=0-{len(blob) - 1}")
    assert not [r for r in seen if r.method == "HEAD"]


def test_s3_the_first_request_is_the_signed_stream_from_byte_zero(
        blob: bytes, moto_s3: MotoS3Server) -> None:
    key = f"rt/{uuid.uuid4().hex[:8]}.tensors"
    moto_s3.put(S3_BUCKET, key, blob)
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        opts = moto_s3.options(s3_endpoint=proxy.url)
        with tensorstream.deserialize(f"s3://{S3_BUCKET}/{key}", device="cpu", **opts) as d:
            assert len(d) == 8
        seen = [r for r in proxy.requests if key in r.path]
    assert seen and seen[0].method == "GET", [(r.method, _range(r.headers)) for r in seen]
    assert _range(seen[0].headers) == "bytes=0-"
    assert "Authorization" in seen[0].headers  # signed (moto checks the signature)
    assert not [r for r in seen if r.method == "HEAD"]


@pytest.mark.parametrize("how", ["filtered", "lazy", "open"])
def test_a_reader_of_a_few_ranges_never_asks_for_every_byte(
        how: str, blob: bytes, http_server: HTTPTestServer) -> None:
    key = f"rt-{uuid.uuid4().hex[:8]}.tensors"
    http_server.put(key, blob)
    url = http_server.url(key)
    if how == "open":
        with tensorstream.open(url, **http_server.options) as f:
            d = tensorizer.TensorDeserializer(f, device="cpu", lazy_load=True)
            assert d["layer.3.weight"].shape == (256, 512)
            d.close()
    else:
        kw = ({"filter_func": lambda name: name == "layer.3.weight"} if how == "filtered"
              else {"lazy_load": True})
        with tensorstream.deserialize(url, device="cpu", **kw, **http_server.options) as d:
            assert d["layer.3.weight"].shape == (256, 512)
    seen = http_server.requests_for(key)
    assert seen[0].method == "HEAD", [(r.method, _range(r.headers)) for r in seen]
    assert not [r for r in seen if _range(r.headers) == "bytes=0-"]
