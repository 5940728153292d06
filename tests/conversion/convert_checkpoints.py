"""What the conversion tests share: a checkpoint of every dtype (``checkpoint``), its safetensors
bytes whole or sharded, tensorizer's own reader (``tensorizer_read``), a byte-exact comparison,
and a listing of a directory (``names_in``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

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


def tensorizer_read(blob: bytes, key: bytes | None = None) -> dict[str, Any]:
    """tensorizer's own TensorDeserializer over the bytes (no tensorstream involved)."""
    decryption = tensorizer.DecryptionParams.from_key(key) if key else None
    with tensorizer.TensorDeserializer(io.BytesIO(blob), device="cpu",
                                       encryption=decryption) as d:
        return {k: d[k].detach().clone() for k in d.keys()}  # noqa: SIM118 - a Mapping


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())
