"""A sharded checkpoint the safetensors tests write into a store (``write_sharded``: three
shards and their index); the stores themselves are ``make_store``'s (tests/stores.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stores import Store

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


def write_sharded(backend: Store, tmp_path: Path, *, extra_in_shard: bool = False) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    tensors = {f"layers.{i}.w": torch.randn(100 + i, 64, generator=g).to(torch.bfloat16)
               for i in range(6)}
    tensors["embed"] = torch.randn(300, 64, generator=g)
    names = sorted(tensors)
    shards = {"model-00001-of-00003.safetensors": names[:2],
              "model-00002-of-00003.safetensors": names[2:5],
              "model-00003-of-00003.safetensors": names[5:]}
    weight_map = {}
    for shard, members in shards.items():
        part = {n: tensors[n] for n in members}
        if extra_in_shard:  # a stale copy that the index does not take from here
            part[names[-1] if shard != "model-00003-of-00003.safetensors" else names[0]] = \
                torch.zeros(1)
        path = tmp_path / shard
        st_torch.save_file(part, str(path))
        backend.put(f"ckpt/{shard}", path.read_bytes())
        weight_map.update({n: shard for n in members})
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    backend.put("ckpt/model.safetensors.index.json", json.dumps(index).encode())
    return tensors
