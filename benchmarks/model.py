"""The synthetic models: named shapes of tensors from a fixed seed, and the copy objects.

Each model is written once per (shape, size, seed) into a cache directory with a
manifest holding the expected checksums, so reruns skip generation:

* ``model.tensors`` (tensorizer) and ``model.safetensors`` (the same tensors, so
  loaders that read safetensors -- the Run:ai streamer -- load the same data),
* ``expected.json``: tensor checksum, whole-file checksum and sizes.

Shapes (:data:`SHAPES`), each filled up to the requested size:

* ``large``: a few tensors of 64 MiB and more (a quarter of the size each),
* ``llama``: a Llama-like layer stack (embedding, q/k/v/o, gate/up/down, norms), fp16,
* ``small``: hundreds of 0.25-2 MiB tensors, fp16 and fp32 mixed,
* ``huge``: one tensor of the whole size,
* ``mixed``: 0.5-32 MiB tensors cycling through fp32, bf16, fp16 and int8,
* ``many`` (run only when named, :data:`EXTRA_SHAPES`): thousands of 16-256 KiB
  fp16 tensors (a mixture of experts' small projections, quantisation scales),
  short names: tensorizer reserves 256 KiB for its index, ~4000 such entries.

Checksums: :func:`tensor_checksum` hashes ``name``, dtype, shape and the CRC32 of
each tensor's bytes in name order; :func:`bytes_checksum` is the CRC32 of a byte
buffer plus its length. CRC32 (~3 GB/s here) catches any short, padded, shifted
or mixed read.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
__all__ = ["EXTRA_SHAPES", "SHAPES", "bytes_checksum", "ensure_blobs", "ensure_model", "file_checksum",
           "tensor_checksum"]

Spec = list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype name)
DTYPE_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _llama(size: int) -> Spec:
    """Llama-like layer shapes, adding layers until ``size`` bytes (fp16) are reached."""
    d = 1024 if size < 768 * MiB else (2048 if size < 8 * GiB else 4096)
    ffn = d * 11 // 4
    vocab = 32000 if size >= 512 * MiB else 8000
    shapes: Spec = [("model.embed_tokens.weight", (vocab, d), "float16")]
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
            n = _numel(shape)
            if total + 2 * n > size:
                shapes.append(("model.norm.weight", (d,), "float16"))
                return shapes
            shapes.append((name, shape, "float16"))
            total += 2 * n
        layer += 1


def _fill(size: int, sizes: Callable[[int], int], dtypes: Callable[[int], str], prefix: str) -> Spec:
    """Tensors of ``sizes(i)`` bytes and ``dtypes(i)`` until ``size`` bytes; rows of 1024 elements."""
    out: Spec = []
    total = i = 0
    while total < size:
        dt = dtypes(i)
        es = DTYPE_SIZE[dt]
        nbytes = min(sizes(i), size - total)
        rows = max(1, nbytes // (1024 * es))
        out.append((f"{prefix}.{i}.weight", (rows, 1024), dt))
        total += rows * 1024 * es
        i += 1
    return out


def _large(size: int) -> Spec:
    each = max(size // 4, min(64 * MiB, size))
    return _fill(size, lambda i: each, lambda i: "float16", "large")


def _small(size: int) -> Spec:
    rng = random.Random(1)
    return _fill(
        size,
        lambda i: rng.randrange(MiB // 4, 2 * MiB + 1, 4096),
        lambda i: "float16" if i % 3 else "float32",
        "small",
    )


def _huge(size: int) -> Spec:
    return [("huge.weight", (max(1, size // (2 * 4096)), 4096), "float16")]


def _mixed(size: int) -> Spec:
    sizes = [16 * MiB, 4 * MiB, MiB, 8 * MiB, 2 * MiB, MiB // 2, 32 * MiB]
    dtypes = ["float32", "bfloat16", "float16", "int8", "float16"]
    return _fill(size, lambda i: sizes[i % len(sizes)], lambda i: dtypes[i % len(dtypes)], "mixed")


def _many(size: int) -> Spec:
    rng = random.Random(3)
    return _fill(size, lambda i: rng.randrange(16 << 10, (256 << 10) + 1, 16 << 10),
                 lambda i: "float16", "m")


SHAPES: dict[str, Callable[[int], Spec]] = {
    "large": _large,
    "llama": _llama,
    "small": _small,
    "huge": _huge,
    "mixed": _mixed,
    "many": _many,
}
#: Shapes run only when named (never in ``all``).
EXTRA_SHAPES = ["many"]


def tensor_checksum(items: Iterable[tuple[str, Any]]) -> str:
    """Checksum of named tensors (any device), independent of their order: name, dtype,
    shape and the CRC32 of the bytes of each (a loader that got the dtype wrong fails)."""
    import torch

    crcs = []
    for name, t in items:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        data = t.contiguous().view(torch.uint8).numpy()
        dtype = str(t.dtype).removeprefix("torch.")
        crcs.append((name, dtype, tuple(t.shape), zlib.crc32(memoryview(data))))
    h = hashlib.sha256()
    for name, dtype, shape, crc in sorted(crcs):
        h.update(f"{name}:{dtype}:{shape}:{crc:08x};".encode())
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


def _generate(shape: str, size: int, seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for name, dims, dtype in SHAPES[shape](size):
        if dtype == "int8":
            sd[name] = torch.randint(-128, 128, dims, generator=gen, dtype=torch.int8)
        else:
            sd[name] = (torch.randn(dims, generator=gen, dtype=torch.float32) * 0.02).to(
                getattr(torch, dtype)
            )
    return sd


def ensure_model(cache: Path, size: int, seed: int = 0, shape: str = "llama") -> dict[str, Any]:
    """Write (or reuse) the ``shape`` model for ``size``/``seed`` under ``cache``; return its manifest."""
    folder = cache / f"model-{shape}-{size}-{seed}"
    manifest_path = folder / "expected.json"
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if all((folder / f).exists() for f in ("model.tensors", "model.safetensors")):
            manifest["dir"] = str(folder)
            return manifest
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file
    from tensorizer import TensorSerializer

    sd = _generate(shape, size, seed)
    ser = TensorSerializer(str(folder / "model.tensors"))
    ser.write_state_dict(sd)
    ser.close()
    save_file(sd, str(folder / "model.safetensors"))
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in sd.values()})
    sizes = [t.numel() * t.element_size() for t in sd.values()]
    manifest = {
        "shape": shape,
        "size_requested": size,
        "seed": seed,
        "tensor_count": len(sd),
        "dtypes": dtypes,
        "tensor_bytes": sum(sizes),
        "tensor_min_bytes": min(sizes),
        "tensor_max_bytes": max(sizes),
        "tensors_checksum": tensor_checksum(sd.items()),
        "file_size": (folder / "model.tensors").stat().st_size,
        "file_checksum": file_checksum(folder / "model.tensors"),
        "safetensors_size": (folder / "model.safetensors").stat().st_size,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    manifest["dir"] = str(folder)
    return manifest


def ensure_blobs(cache: Path, object_size: int, count: int, each: int, seed: int = 0) -> dict[str, Any]:
    """Random objects for the copy scenarios: one of ``object_size`` bytes, a folder of
    ``count`` x ``each`` bytes, and a 1 MiB one; returns their paths and checksums."""
    folder = cache / f"blobs-{object_size}-{count}x{each}-{seed}"
    manifest_path = folder / "expected.json"
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        manifest["dir"] = str(folder)
        return manifest
    rng = random.Random(seed)
    (folder / "folder").mkdir(parents=True, exist_ok=True)

    def write(path: Path, n: int) -> str:
        crc = 0
        with open(path, "wb") as f:
            left = n
            while left:
                chunk = rng.randbytes(min(left, 16 * MiB))
                crc = zlib.crc32(chunk, crc)
                f.write(chunk)
                left -= len(chunk)
        return f"{crc:08x}-{n}"

    manifest = {
        "object": {
            "name": "object.bin",
            "size": object_size,
            "checksum": write(folder / "object.bin", object_size),
        },
        "one_mib": {"name": "one-mib.bin", "size": MiB, "checksum": write(folder / "one-mib.bin", MiB)},
        "folder": {
            "name": "folder",
            "size": count * each,
            "files": {f"{i:03d}.bin": write(folder / "folder" / f"{i:03d}.bin", each) for i in range(count)},
        },
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    manifest["dir"] = str(folder)
    return manifest


def verify_folder(dest: str, expect: Mapping[str, str]) -> bool:
    """Every expected file under ``dest`` with its checksum, and nothing else."""
    root = Path(dest)
    if not root.is_dir():
        return False
    found = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    return found == set(expect) and all(file_checksum(root / k) == v for k, v in expect.items())


def load_redis(port: int, path: str, ts_key: str | None, tz_key: str = "model") -> str:
    """Put the model in Redis: tensorizer's ``to_redis`` layout under ``tz_key`` and, when
    ``ts_key`` is given, tensorstream's own layout under it. Returns a note ('' if fine)."""
    import shutil

    import redis
    from tensorizer import TensorDeserializer

    client = redis.Redis(port=port)
    with TensorDeserializer(path, device="cpu", lazy_load=True) as d:
        d.to_redis(client, tz_key)
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


def upload_to_moto(endpoint: str, objects: Mapping[str, str]) -> int:
    """Create the bucket on moto and upload ``{key: local path}`` (``bucket/key`` keys)."""
    import os

    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "bench"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "bench-secret"),
        region_name="us-east-1",
    )
    buckets = {k.split("/", 1)[0] for k in objects}
    for b in buckets:
        s3.create_bucket(Bucket=b)
    for key, path in objects.items():
        bucket, name = key.split("/", 1)
        s3.upload_file(path, bucket, name)
    return len(objects)


def summary(manifest: Mapping[str, Any]) -> str:
    lo, hi = manifest.get("tensor_min_bytes", 0) / 1024, manifest.get("tensor_max_bytes", 0) / MiB
    return (
        f"{manifest.get('shape', 'llama')}: {manifest['tensor_count']} tensors "
        f"({'/'.join(manifest.get('dtypes', ['float16']))}, {lo:.0f} KiB-{hi:.0f} MiB), "
        f"{manifest['tensor_bytes'] / MiB:.0f} MiB (tensorizer file {manifest['file_size'] / MiB:.0f} MiB)"
    )


if __name__ == "__main__":
    # Heavy work runs in a child so the harness stays small: the kernel carries a
    # parent's RSS high-water mark into children it spawns (vfork/exec), which would
    # inflate every contender's peak RSS.
    import sys

    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "model":
        shape = args[3] if len(args) > 3 else "llama"
        out: object = ensure_model(Path(args[0]), int(args[1]), int(args[2]), shape)
    elif cmd == "blobs":
        out = ensure_blobs(Path(args[0]), int(args[1]), int(args[2]), int(args[3]))
    elif cmd == "redis":
        out = load_redis(int(args[0]), args[1], args[2] or None, args[3] if len(args) > 3 else "model")
    elif cmd == "moto-upload":
        out = upload_to_moto(args[0], json.loads(args[1]))
    elif cmd == "s3-object":
        out = verify_s3_object(args[0], args[1], args[2])
    elif cmd == "tensor-file":
        out = verify_tensor_file(args[0], args[1])
    else:
        sys.exit(f"unknown command {cmd}")
    print("BENCH-RESULT " + json.dumps(out))
