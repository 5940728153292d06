"""Small tensorizer files for tests: a seeded state dict and its serialized bytes."""

from __future__ import annotations

from pathlib import Path

import torch
from tensorizer import TensorSerializer


def random_state(seed: int, count: int, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors ``w0, w1, ...`` of ``shape`` from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(*shape, generator=gen) for i in range(count)}


def tensorizer_bytes(state: dict[str, torch.Tensor], folder: object) -> bytes:
    """``state`` serialized by tensorizer itself (through a file in ``folder``)."""
    path = Path(str(folder)) / "state.tensors"
    ser = TensorSerializer(str(path))
    ser.write_state_dict(state)
    ser.close()
    return path.read_bytes()
