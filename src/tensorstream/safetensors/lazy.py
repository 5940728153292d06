"""Lazy access to one safetensors object, like ``safetensors.safe_open``.

Opening reads the header only. :meth:`SafeOpen.get_tensor` reads one
tensor's bytes; :meth:`SafeOpen.get_slice` returns a view whose indexing
reads only the bytes the index selects (as concurrent ranged reads straight
into the result, or one read of the rows it spans when the pieces are small
and close together).
"""

from __future__ import annotations

import math
import operator
import os
import threading
from itertools import product
from typing import Any

import torch

from ..errors import ConfigurationError
from ..uri import ParsedURI
from .header import DTYPE_SIZES, TensorInfo
from .reader import SafetensorsFile, _device, _finish, byte_view, torch_dtype
from .sources import resolve

__all__ = ["SafeOpen", "SafeSlice", "open"]

#: Pieces of a slice read one by one (concurrently) at most; more, or pieces
#: closer together than :data:`_GAP`, and the rows they span are read whole.
_MAX_PIECES = 1024
_GAP = 256 << 10


class SafeOpen:
    """An open safetensors object (see :func:`open`). Thread-safe; a context manager."""

    def __init__(self, uri: str | os.PathLike[str] | ParsedURI, device: str | torch.device,
                 options: dict[str, Any]) -> None:
        sources = resolve(uri, options)
        if len(sources) != 1 or sources[0].names is not None:
            raise ConfigurationError(
                f"tensorstream.safetensors.open reads one .safetensors object; "
                f"{sources[0].where if sources else uri} is a sharded checkpoint "
                "(use load() or iter_tensors(), or open each shard)")
        self._device = _device(device)
        self._file = SafetensorsFile(sources[0].uri, options)
        self._tensors = self._file.header.by_name()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The redacted URI."""
        return self._file.where

    def keys(self) -> list[str]:
        """Tensor names, sorted (as ``safe_open.keys()``)."""
        return sorted(self._tensors)

    def offset_keys(self) -> list[str]:
        """Tensor names in file order."""
        return [t.name for t in self._file.header.tensors]

    def metadata(self) -> dict[str, str] | None:
        """The file's ``__metadata__``, or None."""
        meta = self._file.header.metadata
        return dict(meta) if meta is not None else None

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape and absolute byte span of tensor ``name``."""
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.name} has no tensor {name!r}") from None

    def get_tensor(self, name: str) -> torch.Tensor:
        """Read tensor ``name`` whole (one ``readinto`` of its span)."""
        t = self.info(name)
        with self._lock:
            out = self._file.read_tensor(t, self._file.reader, pin=self._device.type == "cuda")
        return _finish(out, self._device, None)

    def get_slice(self, name: str) -> SafeSlice:
        """A lazy view of tensor ``name``: index it to read part of it."""
        return SafeSlice(self, self.info(name))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SafeOpen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tensorstream.safetensors.SafeOpen {self.name!r} tensors={len(self._tensors)}>"

    # -- used by SafeSlice ------------------------------------------------------
    def _read(self, ranges: list[tuple[int, memoryview]]) -> None:
        with self._lock:
            self._file.reader.read_ranges(ranges)


class SafeSlice:
    """Part of one tensor, read on indexing: ``f.get_slice("w")[:, 128:256]``.

    Supports integers, slices with a positive step and ``...`` (as safetensors does)."""

    def __init__(self, owner: SafeOpen, info: TensorInfo) -> None:
        self._owner = owner
        self._info = info

    def get_shape(self) -> list[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """The safetensors dtype name (``"BF16"``, ``"F32"``...)."""
        return self._info.dtype

    def __len__(self) -> int:
        if not self._info.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._info.shape[0]

    def __getitem__(self, key: Any) -> torch.Tensor:
        info, owner = self._info, self._owner
        shape = info.shape
        sel = _normalize(key, shape)
        dtype = torch_dtype(info.dtype, owner.name)
        counts = [len(range(*s)) for s, _ in sel]
        out_shape = [c for c, (_, is_int) in zip(counts, sel, strict=True) if not is_int]
        if 0 in counts:
            return _finish(torch.empty(out_shape, dtype=dtype), owner._device, None)
        full = [s == (0, d, 1) for (s, _), d in zip(sel, shape, strict=True)]
        if all(full):
            return owner.get_tensor(info.name).reshape(out_shape)
        k = max(i for i, f in enumerate(full) if not f)
        size = DTYPE_SIZES[info.dtype]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        (lo, _, step_k), _ = sel[k]
        span_k = (counts[k] - 1) * step_k + 1
        run = span_k * strides[k] * size
        pieces = math.prod(counts[:k])
        gap = (shape[k] - span_k) * strides[k] * size
        if pieces == 1 or (pieces <= _MAX_PIECES and gap >= _GAP):
            buf = torch.empty([*counts[:k], span_k, *shape[k + 1:]], dtype=dtype)
            view = byte_view(buf)
            ranges = []
            for j, idx in enumerate(product(*(range(*s) for s, _ in sel[:k]))):
                elem = sum(i * st for i, st in zip(idx, strides, strict=False)) + lo * strides[k]
                ranges.append((info.begin + elem * size, view[j * run:(j + 1) * run]))
            owner._read(ranges)
            local = [slice(None)] * k + [slice(None, None, step_k)]
        else:  # read the rows of dimension 0 that the selection spans
            (lo0, _, step0), _ = sel[0]
            rows = (counts[0] - 1) * step0 + 1
            buf = torch.empty([rows, *shape[1:]], dtype=dtype)
            owner._read([(info.begin + lo0 * strides[0] * size, byte_view(buf))])
            local = [slice(0, rows, step0)] + [slice(*s) for s, _ in sel[1:]]
        part = buf[tuple(local)].contiguous().reshape(out_shape)
        return _finish(part, owner._device, None)


def _normalize(key: Any, shape: tuple[int, ...]) -> list[tuple[tuple[int, int, int], bool]]:
    """``(start, stop, step), is_int`` per dimension; raises like indexing a tensor would."""
    items = list(key) if isinstance(key, tuple) else [key]
    if sum(k is Ellipsis for k in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    if len(items) > len(shape):
        raise IndexError(f"too many indices for a tensor of dimension {len(shape)}")
    items += [slice(None)] * (len(shape) - len(items))
    out = []
    for k, d in zip(items, shape, strict=True):
        if isinstance(k, slice):
            start, stop, step = k.indices(d)
            if step <= 0:
                raise ValueError("slices with a step <= 0 are not supported")
            stop = max(start, stop)
            # Canonical (start, stop, step) so that a full selection compares equal.
            n = len(range(start, stop, step))
            stop = start + (n - 1) * step + 1 if n else start
            if step != 1 and n == 1:
                step = 1
            out.append(((start, stop, step), False))
            continue
        try:
            i = operator.index(k)
        except TypeError:
            raise TypeError(f"unsupported index {k!r}: use integers, slices or ...") from None
        if not -d <= i < d:
            raise IndexError(f"index {i} is out of bounds for a dimension of size {d}")
        i %= d
        out.append(((i, i + 1, 1), True))
    return out


def open(uri: str | os.PathLike[str] | ParsedURI, device: str | torch.device = "cpu",
         **options: Any) -> SafeOpen:  # mirrors safetensors.safe_open on purpose
    """Open one safetensors object lazily, like ``safetensors.safe_open``.

    Reads the header only; ``keys()``, ``metadata()``, ``get_tensor(name)`` and
    ``get_slice(name)[...]`` read what they need. ``options`` as for
    :func:`tensorstream.open`.

    >>> with tensorstream.safetensors.open("s3://b/model.safetensors") as f:  # doctest: +SKIP
    ...     w = f.get_slice("lm_head.weight")[:1024]
    """
    return SafeOpen(uri, device, options)
