"""The 30-second demo: ``python -m tensorstream.demo``.

Builds a small transformer-shaped state dict, serializes it with tensorizer
to a local ``.tensors`` file, streams it back through tensorstream into
tensors, checks every tensor, and prints size and throughput.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def build_state_dict(size_mib: int, seed: int = 0) -> dict[str, object]:
    """fp16 tensors shaped like a small transformer's layers, ~``size_mib`` MiB."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden = 1024
    per_layer = (4 * hidden * hidden + 2 * hidden * 4 * hidden) * 2  # bytes (fp16)
    layers = max(1, (size_mib << 20) // per_layer)
    sd: dict[str, object] = {}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"attn.{name}.weight"] = torch.randn(hidden, hidden, generator=gen).half()
        sd[p + "mlp.up.weight"] = torch.randn(4 * hidden, hidden, generator=gen).half()
        sd[p + "mlp.down.weight"] = torch.randn(hidden, 4 * hidden, generator=gen).half()
        sd[p + "norm.weight"] = torch.ones(hidden).half()
    return sd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorstream.demo",
        description="Serialize a synthetic model with tensorizer, then load it through tensorstream.",
    )
    parser.add_argument("--size-mib", type=int, default=256, help="model size (default 256)")
    parser.add_argument("--path", help="where to write the .tensors file (default: a temp dir)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    args = parser.parse_args(argv)

    import torch
    from tensorizer import TensorSerializer

    import tensorstream

    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or os.path.join(tmp, "model.tensors")
        state_dict = build_state_dict(args.size_mib)
        serializer = TensorSerializer(path)
        serializer.write_state_dict(state_dict)
        serializer.close()
        size = os.path.getsize(path)

        start = time.perf_counter()
        with tensorstream.deserialize(path, device=args.device) as loaded:
            tensors = {name: loaded[name] for name in loaded}
        seconds = time.perf_counter() - start

        mismatched = [
            name for name, t in state_dict.items()
            if not torch.equal(tensors[name].cpu(), t)  # type: ignore[arg-type]
        ]
        if mismatched:
            print(f"MISMATCH in {len(mismatched)} tensors: {mismatched[:5]}", file=sys.stderr)
            return 1
        print(
            f"loaded {len(tensors)} tensors, {size / 2**20:.1f} MiB from {path} "
            f"onto {args.device} in {seconds:.3f}s ({size / seconds / 1e9:.2f} GB/s); "
            "every tensor verified"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
