"""Small tensorizer files for tests: a seeded state dict and its serialized bytes."""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from tensorizer import TensorSerializer


def random_state(seed: int, count: int, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors ``w0, w1, ...`` of ``shape`` from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(*shape, generator=gen) for i in range(count)}


def tensorizer_bytes(state: dict[str, torch.Tensor], folder: object,
                     encryption: Any = None) -> bytes:
    """``state`` serialized by tensorizer itself (through a file in ``folder``),
    encrypted with ``encryption`` (tensorizer ``EncryptionParams``) if given."""
    path = Path(str(folder)) / "state.tensors"
    ser = TensorSerializer(str(path), encryption=encryption)
    ser.write_state_dict(state)
    ser.close()
    return path.read_bytes()


def one_per_dtype(gen: torch.Generator, shape: tuple[int, int], prefix: str) -> dict[str, Any]:
    """One tensor of ``shape`` per dtype safetensors.torch maps (fp8 included), named
    ``prefix + dtype name``, drawn from ``gen`` (callers keep drawing from it after)."""
    from safetensors.torch import _TYPES

    base = torch.randn(*shape, generator=gen)
    out: dict[str, Any] = {}
    for name, dtype in _TYPES.items():
        if dtype.is_floating_point:
            t = base.to(dtype)
        elif dtype == torch.bool:
            t = base > 0
        elif dtype.is_complex:
            t = torch.complex(base, -base).to(dtype)
        else:
            t = torch.randint(0, 100, shape, generator=gen).to(dtype)
        out[f"{prefix}{name}"] = t
    return out


def same_bytes(a: Any, b: Any) -> bool:
    """Same dtype, shape and bytes (``equal`` would call NaN != NaN and refuses fp8)."""
    return bool(a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
                and a.detach().contiguous().reshape(-1).view(torch.uint8).equal(
                    b.detach().contiguous().reshape(-1).view(torch.uint8)))


def disk_fails_at(monkeypatch: pytest.MonkeyPatch, module: ModuleType, nth: int) -> None:
    """The ``nth`` read of ``module`` (its ``_preadv_exact``, or its ``_pread_exact``)
    lands half its bytes, then fails with EIO (the disk failing mid-chunk); every
    other call reads normally."""
    lock = threading.Lock()
    calls = [0]
    vectored = hasattr(module, "_preadv_exact")
    real = module._preadv_exact if vectored else module._pread_exact

    def failing(fd: int, p: str, offset: int, buffers: Any, etag: Any) -> int:
        with lock:
            calls[0] += 1
            n = calls[0]
        if n == nth:
            if vectored:
                half = sum(b.nbytes for b in buffers) // 2
                for b in buffers:  # the first half of the chunk's bytes land
                    take = min(half, b.nbytes)
                    if take:
                        real(fd, p, offset, [b[:take]], etag)
                    offset, half = offset + b.nbytes, half - take
            else:
                real(fd, p, offset, buffers[: len(buffers) // 2], etag)
            raise OSError(5, "Input/output error")
        return int(real(fd, p, offset, buffers, etag))

    monkeypatch.setattr(module, "_preadv_exact" if vectored else "_pread_exact", failing)
