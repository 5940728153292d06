"""Lazy access to a safetensors object or a sharded checkpoint, like ``safetensors.safe_open``.

Opening reads the header only (of a checkpoint: its index; each shard's
header when one of its tensors is first asked for, each tensor read from the
shard the index names). :meth:`SafeOpen.get_tensor` reads one
tensor's bytes; :meth:`SafeOpen.get_slice` returns a view whose indexing
reads only the bytes the index selects (as concurrent ranged reads straight
into the result, or one read of the rows it spans when the pieces are small
and close together).
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import threading
from collections.abc import Iterator
from itertools import product
from typing import Any

import numpy
import torch

from ..errors import ConfigurationError, MalformedFileError, UnsupportedOperationError
from ..headroom import SMALL_CLAIM, check_fits
from ..uri import ParsedURI, parse_uri
from .arguments import _device, _sources
from .dtypes import PACKED, _finish, byte_view, no_data, torch_dtype, torch_shape
from .header import TensorInfo, shown
from .opened_file import SafetensorsFile

__all__ = ["SafeOpen", "SafeSlice", "open"]

#: Pieces of a slice read one by one (concurrently) at most; more, or pieces
#: closer together than :data:`_GAP`, and the rows they span are read whole.
_MAX_PIECES = 1024
_GAP = 256 << 10


class SafeOpen:
    """An open safetensors object or sharded checkpoint (see :func:`open`).
    Thread-safe; a context manager."""

    def __init__(self, uri: str | os.PathLike[str] | ParsedURI, device: str | torch.device | int,
                 options: dict[str, Any]) -> None:
        self._device = _device(device)
        self._options = options
        self._name = parse_uri(uri).redacted()
        sources = _sources(uri, options)
        self._sources = sources
        self._files: list[SafetensorsFile | None] = [None] * len(sources)
        # One lock per shard: reads of one shard are serial (one reader), shards run in parallel.
        self._locks = [threading.Lock() for _ in sources]
        self._open_lock = threading.Lock()
        self._closed = False
        #: tensor name -> index of the source holding it
        self._shard_of: dict[str, int] = {}
        if all(s.names is not None for s in sources):  # an index: shards open on first use
            for i, s in enumerate(sources):
                self._shard_of.update(dict.fromkeys(s.names or (), i))
        else:  # one file, or a folder of files without an index: every header now
            try:
                for i, _s in enumerate(sources):
                    for t in self._file(i).header.tensors:
                        if t.name in self._shard_of:
                            raise MalformedFileError(
                                f"tensor {shown(t.name)} is in more than one file of {self._name}: "
                                f"{sources[self._shard_of[t.name]].where} and {sources[i].where}")
                        self._shard_of[t.name] = i
            except BaseException:
                self.close()
                raise
        if len(sources) == 1:
            self._name = sources[0].where

    @property
    def name(self) -> str:
        """The redacted URI (of the file, or of the index or folder of a checkpoint)."""
        return self._name

    @property
    def shards(self) -> list[str]:
        """The redacted URI of each file (one for a single file), opened or not."""
        return [s.where for s in self._sources]

    def keys(self) -> list[str]:
        """Tensor names, sorted (as ``safe_open.keys()``); of every shard of a checkpoint
        (from its index: no shard is opened)."""
        return sorted(self._shard_of)

    def offset_keys(self) -> list[str]:
        """Tensor names in file order (shard by shard; opens every shard)."""
        out = []
        for i, source in enumerate(self._sources):
            out += [t.name for t in self._file(i).header.tensors
                    if source.names is None or t.name in source.names]
        return out

    def metadata(self) -> dict[str, str] | None:
        """The file's ``__metadata__``, or None. For a checkpoint: the first shard's
        (the shards of one checkpoint carry the same, e.g. ``{"format": "pt"}``)."""
        meta = self._file(0).header.metadata if self._sources else None
        return dict(meta) if meta is not None else None

    def shard_of(self, name: str) -> str:
        """The redacted URI of the file holding tensor ``name``."""
        return self._sources[self._index(name)].where

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape and absolute byte span (in its file) of tensor ``name``."""
        f = self._file(self._index(name))
        t = f.header.by_name().get(name)
        if t is None:
            raise MalformedFileError(f"{f.where} lacks tensor {shown(name)}, which the index "
                                     "puts there")
        return t

    def get_tensor(self, name: str) -> torch.Tensor:
        """Read tensor ``name`` whole (one ``readinto`` of its span)."""
        t = self.info(name)
        if self._device.type == "meta":  # no data to read (every byte was read, then dropped)
            return no_data(t, self.name)
        with self._reading(self._index(name)) as f:
            out = f.read_tensor(t, f.reader, pin=self._device.type == "cuda")
        return _finish(out, self._device, None)

    def get_slice(self, name: str) -> SafeSlice:
        """A lazy view of tensor ``name``: index it to read part of it."""
        return SafeSlice(self, self.info(name))

    def close(self) -> None:
        """Close every shard, once the reads in progress (other threads') have ended."""
        with self._open_lock:
            self._closed = True
            files, self._files = self._files, [None] * len(self._files)
        for lock, f in zip(self._locks, files, strict=True):
            if f is not None:
                # A read in another thread holds the shard's lock: closing under it
                # raised a bare OSError (EBADF) there, and its descriptor's number
                # could be another file's by the next read.
                with lock:
                    f.close()

    def __enter__(self) -> SafeOpen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        shards = f" shards={len(self._sources)}" if len(self._sources) > 1 else ""
        return (f"<tensorstream.safetensors.SafeOpen {self.name!r} "
                f"tensors={len(self._shard_of)}{shards}>")

    # -- internals ----------------------------------------------------------------
    def _index(self, name: str) -> int:
        try:
            return self._shard_of[name]
        except KeyError:
            raise KeyError(f"{self.name} has no tensor {name!r}") from None

    def _file(self, i: int) -> SafetensorsFile:
        """Shard ``i``, its header read on first use."""
        f = self._files[i]
        if f is not None:
            return f
        with self._locks[i]:
            f = self._files[i]
            if f is None:
                if self._closed:
                    raise ValueError(f"{self.name} is closed")
                f = SafetensorsFile(self._sources[i].uri, self._options, source=self._sources[i])
                with self._open_lock:
                    if self._closed:  # closed while the header was read
                        f.close()
                        raise ValueError(f"{self.name} is closed")
                    self._files[i] = f
        return f

    @contextlib.contextmanager
    def _reading(self, i: int) -> Iterator[SafetensorsFile]:
        """Shard ``i``, held for one read (close waits for it); closed: ``ValueError``."""
        f = self._file(i)
        with self._locks[i]:
            if self._closed:
                raise ValueError(f"{self.name} is closed")
            yield f

    def _read(self, name: str, ranges: list[tuple[int, memoryview]]) -> None:
        with self._reading(self._index(name)) as f:
            f.reader.read_ranges(ranges)


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
        dtype = torch_dtype(info.dtype, owner.name, tensor=info.name)
        if info.dtype in PACKED:
            # Elements packed into torch's (F4: pairs) are read whole along the last dimension;
            # the other dimensions slice as usual (safe_open's slice of F4 raised RuntimeError).
            (lo, hi, step), is_int = sel[-1]
            if is_int or (lo, hi, step) != (0, shape[-1], 1):
                raise UnsupportedOperationError(
                    f"{owner.name}: tensor {shown(info.name)} is {info.dtype}, which torch holds "
                    f"{PACKED[info.dtype]} to an element: select all of its last dimension "
                    "(slice the others), or read it whole with get_tensor")
            shape = torch_shape(info, owner.name)
            sel = [*sel[:-1], ((0, shape[-1], 1), False)]
        counts = [len(range(*s)) for s, _ in sel]
        out_shape = [c for c, (_, is_int) in zip(counts, sel, strict=True) if not is_int]
        if owner._device.type == "meta":  # no data to read
            return torch.empty(out_shape, dtype=dtype, device="meta")
        if 0 in counts:
            return _finish(torch.empty(out_shape, dtype=dtype, device="cpu"), owner._device, None)
        full = [s == (0, d, 1) for (s, _), d in zip(sel, shape, strict=True)]
        if all(full):
            return owner.get_tensor(info.name).reshape(out_shape)
        k = max(i for i, f in enumerate(full) if not f)
        size = dtype.itemsize
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        (lo, _, step_k), _ = sel[k]
        span_k = (counts[k] - 1) * step_k + 1
        run = span_k * strides[k] * size
        pieces = math.prod(counts[:k])
        gap = (shape[k] - span_k) * strides[k] * size
        if pieces == 1 or (pieces <= _MAX_PIECES and gap >= _GAP):
            buf = self._buffer([*counts[:k], span_k, *shape[k + 1:]], dtype)
            view = byte_view(buf)
            ranges = []
            for j, idx in enumerate(product(*(range(*s) for s, _ in sel[:k]))):
                elem = sum(i * st for i, st in zip(idx, strides, strict=False)) + lo * strides[k]
                ranges.append((info.begin + elem * size, view[j * run:(j + 1) * run]))
            owner._read(info.name, ranges)
            local = [slice(None)] * k + [slice(None, None, step_k)]
        else:  # read the rows of dimension 0 that the selection spans
            (lo0, _, step0), _ = sel[0]
            rows = (counts[0] - 1) * step0 + 1
            buf = self._buffer([rows, *shape[1:]], dtype)
            owner._read(info.name, [(info.begin + lo0 * strides[0] * size, byte_view(buf))])
            local = [slice(0, rows, step0)] + [slice(*s) for s, _ in sel[1:]]
        if info.dtype in PACKED:  # torch copies no float4 (``copy_`` is not implemented)
            part = buf.view(torch.uint8)[tuple(local)].contiguous().reshape(out_shape).view(dtype)
        else:
            part = buf[tuple(local)].contiguous().reshape(out_shape)
        return _finish(part, owner._device, None)

    def _buffer(self, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Memory for the bytes a slice reads; more than the host has available is
        refused first (torch's allocator raised a bare ``RuntimeError`` for
        ``[::2]`` of a 1 TiB tensor, or the pages were touched until the process died)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes >= SMALL_CLAIM:
            check_fits(nbytes, torch.device("cpu"), None, self._owner.name, count=1,
                       detail=f" (a slice of tensor {self._info.name!r} reads that much)",
                       hint="If the file is right, free memory, or read fewer rows at a time")
        return torch.empty(shape, dtype=dtype, device="cpu")


def _normalize(key: Any, shape: tuple[int, ...]) -> list[tuple[tuple[int, int, int], bool]]:
    """``(start, stop, step), is_int`` per dimension; raises like indexing a tensor would."""
    items = list(key) if isinstance(key, tuple) else [key]
    if sum(k is Ellipsis for k in items) > 1:
        items = _ellipses(items, shape)
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
        if isinstance(k, bool) or str(getattr(k, "dtype", "")) in ("bool", "torch.bool"):
            # torch (and safetensors) take a bool as a mask (a new dimension), never as
            # 0 or 1: operator.index(True) read row 1 instead.
            raise TypeError(f"unsupported index {k!r}: a bool is a mask in torch, not a "
                            "position; use integers, slices or ...")
        if isinstance(k, (torch.Tensor, numpy.ndarray)) and str(k.dtype) in ("uint8",
                                                                            "torch.uint8"):
            # So is a uint8 tensor or array (torch's old mask type): tensor(1, dtype=uint8)
            # read row 1 where torch and safetensors give x[None]. (A numpy uint8 scalar is
            # an integer to torch too.)
            raise TypeError(f"unsupported index {k!r}: a uint8 tensor or array is a mask in "
                            "torch, not a position; use integers, slices or ...")
        try:
            i = operator.index(k)
        except TypeError:
            raise TypeError(f"unsupported index {k!r}: use integers, slices or ...") from None
        if not -d <= i < d:
            raise IndexError(f"index {i} is out of bounds for a dimension of size {d}")
        i %= d
        out.append(((i, i + 1, 1), True))
    return out


def _ellipses(items: list[Any], shape: tuple[int, ...]) -> list[Any]:
    """``items`` with more than one ``...`` as torch (and so safetensors' get_slice) takes
    them: each stands for the dimensions the other indices leave, and what then lies past
    the last dimension is refused by torch itself or selects nothing more."""
    try:  # plain integers and slices: a view, never a copy (a tensor index would gather)
        plain = tuple(k if k is Ellipsis or isinstance(k, slice) else operator.index(k)
                      for k in items if not isinstance(k, bool))
    except TypeError:
        plain = None  # refused by name below
    if plain is not None and len(plain) == len(items):
        # One element seen through the shape (strides 0): torch's own checks, nothing
        # read. (A meta tensor refuses keys a CPU one takes.)
        torch.zeros(()).expand(shape)[plain]  # raises torch's IndexError
    left = max(0, len(shape) - sum(k is not Ellipsis for k in items))
    out: list[Any] = []
    for k in items:
        out.extend([slice(None)] * left if k is Ellipsis else [k])
    return out[:len(shape)]


#: ``safe_open``'s framework names: torch's are taken, the others say what to do.
_TORCH_FRAMEWORKS = frozenset({"pt", "torch", "pytorch"})
_FRAMEWORKS = _TORCH_FRAMEWORKS | {"np", "numpy", "tf", "tensorflow", "flax", "jax", "mlx",
                                   "paddle"}


def open(uri: str | os.PathLike[str] | ParsedURI, device: str | torch.device | int = "cpu", *,
         framework: str = "pt", **options: Any) -> SafeOpen:  # mirrors safetensors.safe_open
    """Open a safetensors object, or a sharded checkpoint, lazily, like ``safetensors.safe_open``.

    ``uri``: a ``.safetensors`` object, a ``model.safetensors.index.json`` or a
    folder/prefix holding one (or holding ``*.safetensors`` files). Opening
    reads the header only (of a checkpoint: its index; each shard's header is
    read when a tensor of it is first asked for). ``keys()``, ``metadata()``,
    ``get_tensor(name)`` and ``get_slice(name)[...]`` read what they need, from
    the shard the index names. ``framework``: ``"pt"`` (torch tensors: the only one),
    for code written for ``safe_open(path, framework="pt")``. ``options`` as for
    :func:`tensorstream.open`.

    >>> with tensorstream.safetensors.open("s3://b/model.safetensors") as f:  # doctest: +SKIP
    ...     w = f.get_slice("lm_head.weight")[:1024]
    """
    # safe_open(path, "pt") moved over as is made "pt" the device: torch's error named no
    # framework, and framework="pt" was an unknown option of the backend.
    if isinstance(device, str) and device.lower() in _FRAMEWORKS:
        raise ConfigurationError(
            f"device={device!r} is a safetensors framework, not a device: "
            "tensorstream.safetensors.open(uri, device='cpu') takes the device second "
            "(safe_open takes the framework second) and returns torch tensors")
    if not isinstance(framework, str) or framework.lower() not in _TORCH_FRAMEWORKS:
        raise ConfigurationError(f"framework={framework!r}: tensorstream.safetensors.open "
                                 "returns torch tensors (framework='pt')")
    return SafeOpen(uri, device, options)
