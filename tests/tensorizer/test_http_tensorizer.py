"""Done-when: a file tensorizer serialized, served over HTTP(S), loads through
``tensorizer.TensorDeserializer(tensorstream.open(url), device="cpu")``."""

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
def serialized(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, object]]:
    """A small real model (~4 MB, mixed dtypes) serialized by tensorizer itself."""
    gen = torch.Generator().manual_seed(0)
    state = {
        "embed.weight": torch.randn(512, 512, generator=gen),
        "layer.0.weight": torch.randn(512, 768, generator=gen).to(torch.float16),
        "layer.0.bias": torch.randn(768, generator=gen),
        "head.weight": torch.randn(768, 256, generator=gen).to(torch.bfloat16),
        "steps": torch.arange(1000, dtype=torch.int64),
    }
    path = Path(tmp_path_factory.mktemp("tensorizer")) / "model.tensors"
    serializer = tensorizer.TensorSerializer(str(path))
    serializer.write_state_dict(state)
    serializer.close()
    return path.read_bytes(), state


def _load_and_compare(url: str, state: dict[str, object], **options: object) -> None:
    with tensorstream.open(url, **options) as f:
        deserializer = tensorizer.TensorDeserializer(f, device="cpu")
        try:
            assert sorted(deserializer.keys()) == sorted(state)
            for name, want in state.items():
                got = deserializer[name]
                assert got.dtype == want.dtype and got.shape == want.shape  # type: ignore[attr-defined]
                assert torch.equal(got, want), name
        finally:
            deserializer.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_tensorizer_loads_a_model_over_http(
        scheme: str, serialized: tuple[bytes, dict[str, object]],
        http_server: HTTPTestServer, https_server: HTTPTestServer) -> None:
    blob, state = serialized
    assert len(blob) > 2 << 20
    server = http_server if scheme == "http" else https_server
    key = f"model-{uuid.uuid4().hex[:8]}.tensors"
    server.put(key, blob)
    _load_and_compare(server.url(key), state, **server.options)
    assert all(r.status in (200, 206) for r in server.requests_for(key))


def test_tensorizer_load_survives_a_dropped_body(
        serialized: tuple[bytes, dict[str, object]], http_server: HTTPTestServer) -> None:
    blob, state = serialized
    key = f"model-{uuid.uuid4().hex[:8]}.tensors"
    http_server.put(key, blob)
    http_server.faults.drop_after = 500_000
    http_server.faults.drop_times = 2
    _load_and_compare(http_server.url(key), state, backoff_initial=0.01)
    assert http_server.faults.dropped == 2


@pytest.mark.parametrize("num_readers", [1, 2])
def test_hundreds_of_tiny_tensors_load_without_waiting_on_the_socket(
        num_readers: int, http_server: HTTPTestServer, tmp_path: Path) -> None:
    """Tensor headers and tiny tensors are read from bytes that have arrived, after
    reads that left the socket's low-water mark high: none of them may wait for
    bytes the body will never send (a poll before the receive waits for the mark)."""
    import time

    state = {f"layer.{i}.w": torch.full((256 + i % 7,), float(i)) for i in range(400)}
    path = tmp_path / "tiny.tensors"
    serializer = tensorizer.TensorSerializer(str(path))
    serializer.write_state_dict(state)
    serializer.close()
    key = f"tiny-{uuid.uuid4().hex[:8]}.tensors"
    http_server.put(key, path.read_bytes())
    began = time.monotonic()
    with tensorstream.deserialize(http_server.url(key), device="cpu", num_readers=num_readers,
                                  timeout_idle=3) as loaded:
        assert sorted(loaded) == sorted(state)
        for name, want in state.items():
            assert torch.equal(loaded[name], want), name
    assert time.monotonic() - began < 2.5
