"""What the tensorizer tests load and where from: a small real model (``TinyNet``),
the backends a test file is put on (``make_backend``: one ``TensorBackend`` per storage
service; adding one is a new branch there) and the two writers of tensorizer files
(``PRODUCERS``: tensorstream's ``serialize`` and tensorizer's own ``TensorSerializer``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import EncryptionParams, TensorSerializer

from fixtures_s3 import S3_BUCKET
from tensorstream.tensorizer.load import serialize

# Cheap Argon2id settings: the tests check wiring, not key-stretching strength.
FAST_KDF = {"opslimit": EncryptionParams.OpsLimit.MIN, "memlimit": EncryptionParams.MemLimit.MIN}


class TinyNet(torch.nn.Module):
    """A small real model: ~1.3 MB of weights in tensors of very different sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, 256)
        self.proj = torch.nn.Linear(256, 512)
        self.norm = torch.nn.LayerNorm(512)
        self.head = torch.nn.Linear(512, 32)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(torch.relu(self.proj(self.embed(ids))))
        return self.head(x) * self.scale[0] + self.scale[1]


def make_model(seed: int = 0) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet().eval()


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(loaded: Any, expected: dict[str, torch.Tensor]) -> None:
    # tensorizer's write_module names a top-level module's own tensors ".name"
    names = {k.lstrip("."): k for k in loaded}
    assert sorted(names) == sorted(expected)
    for name, tensor in expected.items():
        got = loaded[names[name]]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.cpu(), tensor), name


# -- backends -------------------------------------------------------------------
@dataclasses.dataclass
class TensorBackend:
    """Where test files are put: ``put(key, bytes)`` then read ``uri(key)``."""

    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    options: dict[str, Any]
    writable: bool


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> TensorBackend:
    if name == "local":
        root = tmp_path / "store"
        root.mkdir()
        return TensorBackend(
            "local", lambda k: str(root / k), lambda k, d: (root / k).write_bytes(d), {}, True
        )
    if name == "http":
        server = request.getfixturevalue("http_server")
        prefix = f"t{abs(hash(request.node.nodeid)) % 10**8}/"
        return TensorBackend(
            "http",
            lambda k: server.url(prefix + k),
            lambda k, d: server.put(prefix + k, d),
            dict(server.options),
            False,
        )
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        prefix = f"tensorizer/t{abs(hash(request.node.nodeid)) % 10**8}/"
        return TensorBackend(
            "s3",
            lambda k: f"s3://{S3_BUCKET}/{prefix}{k}",
            lambda k, d: s3.put(S3_BUCKET, prefix + k, d),
            s3.options(),
            True,
        )
    if name == "redis":
        server = request.getfixturevalue("redis_server")
        prefix = f"tensorizer-t{abs(hash(request.node.nodeid)) % 10**8}/"
        return TensorBackend(
            "redis",
            lambda k: server.url(prefix + k),
            lambda k, d: server.put(prefix + k, d),
            {},
            True,
        )
    raise AssertionError(name)


def tensorizer_bytes(obj: Any, path: Path, encryption: Any = None) -> bytes:
    s = TensorSerializer(str(path), encryption=encryption)
    if isinstance(obj, torch.nn.Module):
        s.write_module(obj)
    else:
        s.write_state_dict(obj)
    s.close()
    return path.read_bytes()


def tensorstream_bytes(obj: Any, path: Path, encryption: Any = None) -> bytes:
    serialize(obj, path, encryption=encryption)
    return path.read_bytes()


PRODUCERS = {"tensorstream": tensorstream_bytes, "tensorizer": tensorizer_bytes}
