"""The synthetic model: fp16 tensors shaped like a transformer's, from a fixed seed.

The model is written once per (size, seed) into a cache directory with a
manifest holding the expected checksums, so reruns skip generation:

* ``model.tensors`` (tensorizer), ``model.safetensors`` (same tensors),
* ``expected.json``: tensor checksum, whole-file checksum and sizes.

Checksums: :func:`tensor_checksum` hashes ``name`` + CRC32 of each tensor's bytes
in name order; :func:`bytes_checksum` is the CRC32 of a byte buffer plus its
length. CRC32 (~3 GB/s here) catches any short, padded, shifted or mixed read.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
__all__ = ["bytes_checksum", "ensure_model", "file_checksum", "tensor_checksum"]


def _shapes(size: int) -> list[tuple[str, tuple[int, ...]]]:
    """Llama-like layer shapes, adding layers until ``size`` bytes (fp16) are reached."""
    d = 1024 if size < 768 * MiB else (2048 if size < 8 * GiB else 4096)
    ffn = d * 11 // 4
    vocab = 32000 if size >= 512 * MiB else 8000
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, d))]
    total = vocab * d * 2
    layer = 0
    while True:
        prefix = f"model.layers.{layer}"
        block = [
            (f"{prefix}.input_layernorm.weight", (d,)),
            (f"{prefix}.self_attn.q_proj.weight", (d, d)),
            (f"{prefix}.self_attn.k_proj.weight", (d, d)),
            (f"{prefix}.self_attn.v_proj.weight", (d, d)),
            (f"{prefix}.self_attn.o_proj.weight", (d, d)),
            (f"{prefix}.post_attention_layernorm.weight", (d,)),
            (f"{prefix}.mlp.gate_proj.weight", (ffn, d)),
            (f"{prefix}.mlp.up_proj.weight", (ffn, d)),
            (f"{prefix}.mlp.down_proj.weight", (d, ffn)),
        ]
        for name, shape in block:
            n = 1
            for s in shape:
                n *= s
            if total + 2 * n > size:
                shapes.append(("model.norm.weight", (d,)))
                return shapes
            shapes.append((name, shape))
            total += 2 * n
        layer += 1


def tensor_checksum(items: Iterable[tuple[str, Any]]) -> str:
    """Checksum of named tensors (any device), independent of their order."""
    import torch

    crcs = []
    for name, t in items:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        data = t.contiguous().view(torch.uint8).numpy()
        crcs.append((name, t.numel(), zlib.crc32(memoryview(data))))
    h = hashlib.sha256()
    for name, n, crc in sorted(crcs):
        h.update(f"{name}:{n}:{crc:08x};".encode())
    return h.hexdigest()[:32]


def bytes_checksum(parts: Iterable[Any]) -> str:
    """CRC32 and total length of byte buffers taken in order."""
    crc, n = 0, 0
    for p in parts:
        view = memoryview(p).cast("B")
        crc = zlib.crc32(view, crc)
        n += len(view)
    return f"{crc:08x}-{n}"


def file_checksum(path: str | Path, chunk: int = 16 * MiB) -> str:
    """:func:`bytes_checksum` of a file's contents."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    crc, n = 0, 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(buf):
            crc = zlib.crc32(view[:got], crc)
            n += got
    return f"{crc:08x}-{n}"


def _generate(size: int, seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in _shapes(size):
        sd[name] = (torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02).half()
    return sd


def ensure_model(cache: Path, size: int, seed: int = 0) -> dict[str, Any]:
    """Write (or reuse) the model for ``size``/``seed`` under ``cache``; return its manifest."""
    folder = cache / f"model-{size}-{seed}"
    manifest_path = folder / "expected.json"
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if all((folder / f).exists() for f in ("model.tensors", "model.safetensors")):
            manifest["dir"] = str(folder)
            return manifest
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file
    from tensorizer import TensorSerializer

    sd = _generate(size, seed)
    ser = TensorSerializer(str(folder / "model.tensors"))
    ser.write_state_dict(sd)
    ser.close()
    save_file(sd, str(folder / "model.safetensors"))
    manifest = {
        "size_requested": size,
        "seed": seed,
        "tensor_count": len(sd),
        "tensor_bytes": sum(t.numel() * 2 for t in sd.values()),
        "tensors_checksum": tensor_checksum(sd.items()),
        "file_size": (folder / "model.tensors").stat().st_size,
        "file_checksum": file_checksum(folder / "model.tensors"),
        "safetensors_size": (folder / "model.safetensors").stat().st_size,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    manifest["dir"] = str(folder)
    return manifest


def load_redis(port: int, path: str, ts_key: str | None) -> str:
    """Put the model in Redis: tensorizer's ``to_redis`` layout under ``model`` and, when
    ``ts_key`` is given, tensorstream's own layout under it. Returns a note ('' if fine)."""
    import shutil

    import redis
    from tensorizer import TensorDeserializer

    client = redis.Redis(port=port)
    with TensorDeserializer(path, device="cpu", lazy_load=True) as d:
        d.to_redis(client, "model")
    client.close()
    if not ts_key:
        return ""
    import tensorstream

    try:
        with open(path, "rb") as src, tensorstream.open(f"redis://127.0.0.1:{port}/0/{ts_key}", "wb") as dst:
            shutil.copyfileobj(src, dst, 64 * MiB)
    except Exception as exc:  # reported; tensorstream then reads tensorizer's layout
        return f"writing Redis with tensorstream failed: {exc!r}"
    return ""


def verify_tensor_file(path: str, expect: str) -> bool:
    from tensorizer import TensorDeserializer

    with TensorDeserializer(path, device="cpu") as d:
        return tensor_checksum(d.items()) == expect


def verify_s3_object(endpoint: str, path: str, expect: str) -> bool:
    """Checksum of an object on the (moto) S3 server; deletes it afterwards."""
    import os

    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "bench"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "bench-secret"),
        region_name="us-east-1",
    )
    bucket, key = path.split("/", 1)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.delete_object(Bucket=bucket, Key=key)
    return bytes_checksum([body]) == expect


def summary(manifest: Mapping[str, Any]) -> str:
    return (
        f"{manifest['tensor_count']} fp16 tensors, {manifest['tensor_bytes'] / MiB:.0f} MiB "
        f"(tensorizer file {manifest['file_size'] / MiB:.0f} MiB)"
    )


if __name__ == "__main__":
    # Heavy work runs in a child so the harness stays small: the kernel carries a
    # parent's RSS high-water mark into children it spawns (vfork/exec), which would
    # inflate every contender's peak RSS.
    import sys

    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "model":
        out: object = ensure_model(Path(args[0]), int(args[1]), int(args[2]))
    elif cmd == "redis":
        out = load_redis(int(args[0]), args[1], args[2] or None)
    elif cmd == "s3-object":
        out = verify_s3_object(args[0], args[1], args[2])
    elif cmd == "tensor-file":
        out = verify_tensor_file(args[0], args[1])
    else:
        sys.exit(f"unknown command {cmd}")
    print("BENCH-RESULT " + json.dumps(out))
