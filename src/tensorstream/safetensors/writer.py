"""Write tensors as a safetensors object to any writable backend, atomically."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ..api import open as ts_open
from ..errors import ConfigurationError
from ..uri import ParsedURI, is_utf8
from .dtypes import _DTYPES, PACKED, _check_byteorder, byte_view
from .header import encode_header

__all__ = ["save", "save_order"]

_NAMES = {getattr(torch, attr): name for name, attr in _DTYPES.items() if hasattr(torch, attr)}


#: Dtypes in the order ``safetensors`` lays tensors out (descending alignment: the
#: Rust crate's ``Dtype`` order, reversed).
_SAVE_RANK = {name: rank for rank, name in enumerate((
    "U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16",
    "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8",
    "F6_E3M2", "F6_E2M3", "F4", "BOOL"))}


def save_order(name: str, dtype: str) -> tuple[int, str]:
    """The sort key of a tensor in ``safetensors.torch.save_file``'s layout: widest dtype
    first, then by name (code point order: the Rust crate's byte order of UTF-8), so every
    tensor starts at a multiple of its element size. Used by :func:`save` and by
    ``tensorstream.convert``: one layout, the one ``save_file`` writes."""
    return _SAVE_RANK.get(dtype, len(_SAVE_RANK)), name


def _dtype_name(name: str, t: torch.Tensor) -> str:
    try:
        return _NAMES[t.dtype]
    except KeyError:
        raise ConfigurationError(f"tensor {name!r} has dtype {t.dtype}, which safetensors "
                                 "cannot hold") from None


def _file_shape(name: str, dtype: str, t: torch.Tensor) -> tuple[int, ...]:
    """The shape the header gives: a packed dtype's elements counted one by one (a
    ``float4_e2m1fn_x2`` ``[n, k]`` is F4 ``[n, 2k]``, as safetensors writes it)."""
    per = PACKED.get(dtype)
    if per is None:
        return tuple(t.shape)
    if t.dim() == 0:
        raise ConfigurationError(f"tensor {name!r} is a 0-dim {t.dtype}: safetensors holds "
                                 f"{dtype} along a last dimension; reshape it to (1,)")
    return (*t.shape[:-1], t.shape[-1] * per)


def _check_unicode(text: str, what: str) -> None:
    """Refuse a lone surrogate (``"\\ud800"``): JSON would escape it, and the file
    would be one that neither safetensors nor tensorstream loads."""
    if not is_utf8(text):
        raise ConfigurationError(f"{what} {text!r} is not valid Unicode (a lone surrogate); "
                                 "safetensors cannot store it")


def save(
    tensors: Mapping[str, torch.Tensor],
    uri: str | os.PathLike[str] | ParsedURI,
    metadata: Mapping[str, str] | None = None,
    **options: Any,
) -> None:
    """Write ``tensors`` as a safetensors file at ``uri`` (any writable backend).

    The object appears whole when the write completes, or not at all (an
    error leaves the destination as it was). Tensors are laid out as
    ``safetensors.torch.save_file`` lays them out (widest dtype first, then by
    name: each starts aligned to its element size), each written from host
    memory (a GPU tensor is copied to the host one at a time). ``metadata``: strings only, stored as
    ``__metadata__``. The result loads with ``safetensors.torch.load_file``.
    ``options`` as for :func:`tensorstream.open`.

    >>> tensorstream.safetensors.save(model.state_dict(), "s3://b/model.safetensors")  # doctest: +SKIP
    """
    _check_byteorder()
    if not isinstance(tensors, Mapping):
        raise ConfigurationError(f"tensors must map names to tensors, got {type(tensors).__name__}")
    if metadata is not None and (not isinstance(metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ConfigurationError("safetensors metadata must map strings to strings")
    for text in (*(metadata or ()), *(metadata or {}).values()):
        _check_unicode(text, "metadata")
    for name in tensors:  # before sorting them: a name that is no string cannot be ordered
        if not isinstance(name, str) or name == "__metadata__":
            raise ConfigurationError(f"invalid tensor name {name!r}")
        _check_unicode(name, "tensor name")
    entries = []
    for name in tensors:
        t = tensors[name]
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            raise ConfigurationError(f"{name!r} is not a dense tensor")
        if t.device.type == "meta":
            raise ConfigurationError(f"{name!r} is on the meta device: it has no data to save")
        dtype = _dtype_name(name, t)
        entries.append((name, dtype, _file_shape(name, dtype, t), t.numel() * t.element_size()))
    # safetensors' own order (widest dtype first, then name): every tensor starts at a
    # multiple of its element size, and the file is the one save_file writes.
    entries.sort(key=lambda entry: save_order(entry[0], entry[1]))
    header = encode_header(entries, metadata)
    with ts_open(uri, "wb", **options) as out:
        out.write(header)
        for name, *_ in entries:
            t = tensors[name].detach()
            host = t.to("cpu").contiguous() if t.device.type != "cpu" else t.contiguous()
            # A conjugate or negative view's memory holds the unconjugated numbers (and
            # has no byte view): its values are what is saved (no copy for others).
            host = host.resolve_conj().resolve_neg()
            if host.numel():
                out.write(byte_view(host))
