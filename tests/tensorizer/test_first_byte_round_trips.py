"""Round trips before the first tensor byte of an HTTP load: every request to
an object store pays its time-to-first-byte (20-50 ms), so each one the load
makes before the stream from byte 0 delays every tensor. Today: one ``HEAD``
(size and validators), then one ``GET`` from byte 0 to the end whose body
carries the header, the index and the first tensors. A separate read of the
header or index, or a second probe, would add a sequential round trip."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer

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
def test_one_request_before_the_stream_from_byte_zero(
        how: str, blob: bytes, http_server: HTTPTestServer) -> None:
    key = f"rt-{uuid.uuid4().hex[:8]}.tensors"
    http_server.put(key, blob)
    url = http_server.url(key)
    if how == "open":
        with tensorstream.open(url, **http_server.options) as f:
            d = tensorizer.TensorDeserializer(f, device="cpu")
            assert len(d) == 8
            d.close()
    else:
        with tensorstream.deserialize(url, device="cpu", **http_server.options) as d:
            assert len(d) == 8
    seen = http_server.requests_for(key)
    first_get = next(i for i, r in enumerate(seen) if r.method == "GET")
    before = seen[:first_get]
    assert [r.method for r in before] == ["HEAD"], [(r.method, _range(r.headers)) for r in seen]
    # The first GET streams from byte 0 to the end: header, index and the first
    # tensors share its one time-to-first-byte.
    assert _range(seen[first_get].headers) in (None, f"bytes=0-{len(blob) - 1}")
