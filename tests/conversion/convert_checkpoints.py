"""What the conversion tests share: a checkpoint of every dtype (``checkpoint``), its safetensors
bytes whole or sharded, tensorizer's own reader (``tensorizer_read``), a byte-exact comparison,
and the stores a conversion reads and writes (``make_store``: local, S3, Redis)."""

from __future__ import annotations

import dataclasses
import io
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")

from tensor_files import one_per_dtype, same_bytes  # noqa: E402  (needs torch)


def checkpoint() -> dict[str, Any]:
    """One tensor per dtype safetensors.torch maps (fp8 included), 0-dim, empty, 1 MB."""
    g = torch.Generator().manual_seed(3)
    out = one_per_dtype(g, (17, 9), "layers.0.")
    out["scalar"] = torch.tensor(1.25)
    out["empty"] = torch.empty(0, 5)  # f32: bf16/fp8 empties are refused (test_convert_refusals.py)
    out["big.weight"] = torch.randn(512, 512, generator=g)
    return out


def assert_same(got: Any, want: dict[str, Any]) -> None:
    assert sorted(got.keys()) == sorted(want)
    for name, t in want.items():
        assert same_bytes(got[name], t), name


def st_bytes(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    return st_torch.save(tensors, metadata=metadata)


def sharded(tensors: dict[str, Any], shards: int = 3) -> dict[str, bytes]:
    """``{file name: bytes}`` of a checkpoint written by safetensors, with its index."""
    names = sorted(tensors)
    files: dict[str, bytes] = {}
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        files[shard] = st_bytes(part, {"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
    return files


@dataclasses.dataclass
class Store:
    """A writable backend: ``uri(key)``, ``put(key, bytes)``, options; reads go through
    tensorstream (Redis holds written objects in its chunked layout)."""

    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    options: dict[str, Any]
    exists: Callable[[str], bool]

    def get(self, key: str) -> bytes:
        with tensorstream.open(self.uri(key), **self.options) as f:
            return bytes(f.read())


def make_store(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    prefix = f"cv{secrets.token_hex(4)}/"
    if name == "local":
        root = tmp_path / "store"
        root.mkdir()

        def put(k: str, d: bytes) -> None:
            (root / k).parent.mkdir(parents=True, exist_ok=True)
            (root / k).write_bytes(d)

        return Store(name, lambda k: str(root / k), put, {}, lambda k: (root / k).exists())
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        return Store(name, lambda k: f"s3://{S3_BUCKET}/{prefix}{k}",
                     lambda k, d: s3.put(S3_BUCKET, prefix + k, d), s3.options(),
                     lambda k: s3.exists(S3_BUCKET, prefix + k))
    if name == "redis":
        server = request.getfixturevalue("redis_server")
        rp = prefix.rstrip("/") + "-"

        def exists(k: str) -> bool:
            try:
                tensorstream.open(server.url(rp + k)).close()
            except FileNotFoundError:
                return False
            return True

        return Store(name, lambda k: server.url(rp + k), lambda k, d: server.put(rp + k, d), {},
                     exists)
    raise AssertionError(name)


def tensorizer_read(blob: bytes, key: bytes | None = None) -> dict[str, Any]:
    """tensorizer's own TensorDeserializer over the bytes (no tensorstream involved)."""
    decryption = tensorizer.DecryptionParams.from_key(key) if key else None
    with tensorizer.TensorDeserializer(io.BytesIO(blob), device="cpu",
                                       encryption=decryption) as d:
        return {k: d[k].detach().clone() for k in d.keys()}  # noqa: SIM118 - a Mapping


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())
