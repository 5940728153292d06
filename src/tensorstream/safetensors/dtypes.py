"""safetensors dtypes in torch: the torch dtype and shape of a tensor the header
describes (:func:`torch_dtype`, :func:`torch_shape`; F4's packed pairs, :data:`PACKED`),
a writable byte view of a tensor's memory (:func:`byte_view`), and which dtypes
``dtype=`` casts, on the way to the caller's device."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..errors import MalformedFileError, UnsupportedOperationError
from .header import TensorInfo, shown

__all__ = ["LEAVE_OUT", "PACKED", "byte_view", "no_data", "torch_dtype", "torch_shape"]

_DTYPES: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}

#: Dtypes torch holds several elements to one of its own (as safetensors maps them):
#: F4 in pairs, ``float4_e2m1fn_x2``, whose last dimension is half the file's.
PACKED: dict[str, int] = {"F4": 2}


#: What to do about a tensor torch has no dtype for, said by the loaders.
LEAVE_OUT = ("leave it out (filter=) to load the other tensors, or read its bytes with "
             "tensorstream.read_range (open(...).info(name) gives its span)")


def torch_dtype(name: str, where: str = "", *, tensor: str | None = None,
                hint: str = LEAVE_OUT) -> torch.dtype:
    """The torch dtype of a safetensors dtype name. One this torch lacks (FP6, which
    safetensors reads and torch has no dtype for; FP8 E8M0 before torch 2.7) is an
    :class:`UnsupportedOperationError` naming the file and ``tensor``, and ``hint``."""
    attr = _DTYPES.get(name)
    dtype = getattr(torch, attr, None) if attr else None
    if not isinstance(dtype, torch.dtype):
        which = f"tensor {shown(tensor)} is {name}" if tensor is not None else f"dtype {name}"
        raise UnsupportedOperationError(
            f"{where}: {which}, which torch {torch.__version__} has no dtype for"
            + (f": {hint}" if hint else ""))
    return dtype


def torch_shape(t: TensorInfo, where: str = "") -> tuple[int, ...]:
    """The shape of ``t`` in torch: the file's, less a packed dtype's pairing (an F4
    ``[4096, 2048]`` is a ``float4_e2m1fn_x2`` ``[4096, 1024]``, as safetensors loads it)."""
    per = PACKED.get(t.dtype)
    if per is None:
        return t.shape
    if not t.shape or t.shape[-1] % per:
        raise MalformedFileError(
            f"{where}: tensor {shown(t.name)} is {t.dtype} of shape {list(t.shape)}: torch holds "
            f"{t.dtype} {per} to an element ({_DTYPES[t.dtype]}), so its last dimension must be "
            f"a multiple of {per}")
    return (*t.shape[:-1], t.shape[-1] // per)


def no_data(t: TensorInfo, where: str = "") -> torch.Tensor:
    """``t`` on the meta device: its dtype and shape, no memory and nothing read (a load
    onto ``device="meta"`` read every byte to drop it)."""
    return torch.empty(torch_shape(t, where), dtype=torch_dtype(t.dtype, where, tensor=t.name),
                       device="meta")


def _check_byteorder() -> None:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise NotImplementedError("safetensors are little-endian; this host is big-endian")


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous tensor's memory (any dtype, 0-dim included)."""
    # Flattened by as_strided, not reshape: torch calls a tensor of one element contiguous
    # whatever its strides (``w[:, 0][0:1]``: stride 5), and reshape kept that stride,
    # which a dtype view refuses (save raised a bare RuntimeError).
    array: Any = t.as_strided((t.numel(),), (1,)).view(torch.uint8).numpy()
    return memoryview(array).cast("B")


_PACKED_TORCH = frozenset(d for d in (getattr(torch, _DTYPES[n], None) for n in PACKED)
                          if isinstance(d, torch.dtype))


def _casts(have: torch.dtype, dtype: torch.dtype | None) -> bool:
    """Whether ``dtype=`` casts a tensor of dtype ``have``: floating-point ones only (a
    packed dtype, F4's float4_e2m1fn_x2, has no cast: it is kept, as integers are)."""
    return (dtype is not None and have.is_floating_point and have != dtype
            and have not in _PACKED_TORCH)


def _finish(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    if device.type != "cpu":
        # From pinned memory: the copy overlaps the next tensor's read.
        t = t.to(device, non_blocking=True)
    if dtype is not None and _casts(t.dtype, dtype):
        t = t.to(dtype)
    return t
