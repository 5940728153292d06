"""Where the safetensors tests put their files (``make_backend``: local, HTTP, S3, Redis and
an in-memory provider registered as ``memtest://``) and a sharded checkpoint written there
(``write_sharded``: three shards and their index)."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from memory_provider import MemProvider

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

tensorstream.register("memtest", MemProvider, replace=True)


@dataclasses.dataclass
class Backend:
    """Where test files are put: ``put(key, bytes)`` then read ``uri(key)``."""

    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes] | None
    options: dict[str, Any]


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    prefix = f"st{secrets.token_hex(4)}/"
    if name == "local":
        root = tmp_path / "store"
        root.mkdir()

        def put(k: str, d: bytes) -> None:
            (root / k).parent.mkdir(parents=True, exist_ok=True)
            (root / k).write_bytes(d)

        return Backend(name, lambda k: str(root / k), put, lambda k: (root / k).read_bytes(), {})
    if name == "http":
        server = request.getfixturevalue("http_server")
        request.getfixturevalue("http_reset")
        return Backend(name, lambda k: server.url(prefix + k),
                       lambda k, d: server.put(prefix + k, d), None, dict(server.options))
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        return Backend(name, lambda k: f"s3://{S3_BUCKET}/{prefix}{k}",
                       lambda k, d: s3.put(S3_BUCKET, prefix + k, d),
                       lambda k: s3.get(S3_BUCKET, prefix + k), s3.options())
    if name == "redis":
        server = request.getfixturevalue("redis_server")
        rp = prefix.rstrip("/") + "-"
        return Backend(name, lambda k: server.url(rp + k), lambda k, d: server.put(rp + k, d),
                       None, {})
    if name == "mem":
        bucket = "b" + secrets.token_hex(4)

        def mput(k: str, d: bytes) -> None:
            MemProvider.store[f"{bucket}/{k}"] = d

        return Backend(name, lambda k: f"memtest://{bucket}/{k}", mput,
                       lambda k: MemProvider.store[f"{bucket}/{k}"], {})
    raise AssertionError(name)


def write_sharded(backend: Backend, tmp_path: Path, *, extra_in_shard: bool = False) -> dict[str, Any]:
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
