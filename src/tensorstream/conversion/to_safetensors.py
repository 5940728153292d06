"""tensorizer (optionally encrypted) -> one safetensors file.

The safetensors header lists every tensor's dtype, shape and offsets before
the data, and tensorizer's index (parsed by ``TensorDeserializer``, no tensor
read) holds all three: the header is written first, in the layout
``safetensors.torch.save_file`` writes (widest dtype first, then by name:
every tensor starts aligned to its element size, and the file is the one
``save_file`` makes of the same tensors, :func:`~tensorstream.safetensors.writer.save_order`),
then the tensors are loaded in that order, a batch of at most
:data:`BATCH_BYTES` (or one larger tensor) at a time (tensorizer is asked
for each run of a batch's tensors that are neighbours in its file, so it
reads no tensor header between them), decrypted by tensorizer, and streamed
through
``tensorstream.open(uri, "wb")``: sequential, atomic at the destination, so
any backend works without a local temporary file (a local destination is
written beside it and renamed). Memory: one batch plus the reader's
read-ahead window and the writer's 8 MiB buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy
import torch

from ..api import open as ts_open
from ..errors import MalformedFileError
from ..providers.local.provider import naming_write_errors
from ..safetensors.dtypes import PACKED, byte_view
from ..safetensors.header import encode_header, shown
from ..safetensors.writer import _NAMES, save_order
from ..tensorizer.crypto import DecryptionError
from ..tensorizer.hook import CryptographyError, IndexEntry, forget, index_entries, rewind
from ..uri import ParsedURI
from ._local import local_target
from .errors import UnsupportedDtypeError

__all__ = ["BATCH_BYTES", "Planned", "plan", "write_safetensors"]

#: The dtypes a converted file may hold: not the packed ones (F4), whose header shape
#: is not the tensor's (safetensors.save does that, not this plan).
SAFETENSORS_NAMES = {d: n for d, n in _NAMES.items() if n not in PACKED}

#: Tensors loaded from the tensorizer file at a time (by bytes; a larger tensor alone).
BATCH_BYTES = 64 << 20
#: Bytes handed to the writer at a time (it copies what it is given into its buffer).
_WRITE_CHUNK = 8 << 20
_OPAQUE_SEP = "\0"


@dataclasses.dataclass(frozen=True)
class Planned:
    """One tensor to write: where it comes from, what the header says."""

    entry: IndexEntry
    name: str
    dtype: torch.dtype
    nbytes: int
    #: where the tensor is in the tensorizer file's order (0: its first)
    position: int


def torch_dtype_of(dtype: str) -> torch.dtype | None:
    """The torch dtype of a tensorizer dtype string, or None if torch has none."""
    if _OPAQUE_SEP in dtype:  # "<V2\0torch.bfloat16": numpy lacks it, torch names it
        name = dtype.split(_OPAQUE_SEP, 1)[1].removeprefix("torch.")
        found = getattr(torch, name, None)
        return found if isinstance(found, torch.dtype) else None
    try:
        return torch.from_numpy(numpy.empty(0, dtype=numpy.dtype(dtype))).dtype
    except (TypeError, ValueError):
        return None


def _shown(dtype: str) -> str:
    return dtype.split(_OPAQUE_SEP, 1)[-1]


def plan(deserializer: Any, where: str) -> list[Planned]:
    """What the safetensors file will hold, checked before anything is written, in the
    order it holds them."""
    out: list[Planned] = []
    names: dict[str, str] = {}
    for position, entry in enumerate(index_entries(deserializer)):
        # write_module names a top-level module's own tensors ".weight"; a state dict
        # (what safetensors holds) names them "weight". A state dict's own names are kept
        # as they are (".lead" stays ".lead").
        name = entry.name
        if entry.kind != "state_dict" and name.startswith("."):
            name = name[1:]
        dtype = torch_dtype_of(entry.dtype)
        if dtype is None or dtype not in SAFETENSORS_NAMES:
            known = ", ".join(sorted(str(d).removeprefix("torch.") for d in SAFETENSORS_NAMES))
            raise UnsupportedDtypeError(
                f"{where}: tensor {shown(entry.name)} has dtype "
                f"{str(dtype).removeprefix('torch.') if dtype else _shown(entry.dtype)}, which "
                f"safetensors cannot hold (it holds: {known})")
        numel = 1
        for d in entry.shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if numel and entry.data_length == 0:
            raise UnsupportedDtypeError(
                f"{where}: tensor {shown(entry.name)} was written from the meta device (shape "
                f"{list(entry.shape)}, no data); safetensors has no way to store it")
        if name == "__metadata__":  # the header's metadata key: the file would not load
            raise UnsupportedDtypeError(
                f"{where}: tensor {shown(entry.name)} would be named '__metadata__', which "
                "safetensors reserves for the file's metadata; rename the tensor")
        if name in names:
            raise MalformedFileError(
                f"{where}: tensors {shown(names[name])} and {shown(entry.name)} would both be named "
                f"{shown(name)} in safetensors")
        names[name] = entry.name
        out.append(Planned(entry, name, dtype, nbytes, position))
    # save_file's layout, not the tensorizer file's order: a tensor after an odd-sized one
    # started misaligned (safetensors' zero-copy readers need the alignment), and the file
    # differed from the one save_file writes of the same tensors.
    out.sort(key=lambda p: save_order(p.name, SAFETENSORS_NAMES[p.dtype]))
    return out


def _batches(planned: list[Planned]) -> list[list[Planned]]:
    out: list[list[Planned]] = [[]]
    size = 0
    for p in planned:
        if out[-1] and size + p.nbytes > BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.nbytes
    return [b for b in out if b]


def _runs(batch: list[Planned]) -> list[set[Any]]:
    """The keys of ``batch`` in runs of tensors that follow each other in the tensorizer
    file, in file order."""
    runs: list[set[Any]] = []
    last = None
    for p in sorted(batch, key=lambda p: p.position):
        if last is None or p.position != last + 1:
            runs.append(set())
        runs[-1].add(p.entry.key)
        last = p.position
    return runs


def _load(deserializer: Any, batch: list[Planned], where: str) -> dict[Any, torch.Tensor]:
    # One read per run of neighbours in the file: tensorizer reads from the first tensor it
    # is asked for to the last, every tensor header between them (each after a seek over
    # the data: a read-ahead request of its own), so one read of a batch scattered over the
    # file fetched ~2x the file. The read-ahead stops at each run's end.
    deserializer._ts_read_to_last = True
    got: dict[Any, torch.Tensor] = {}
    try:
        for keys in _runs(batch):
            rewind(deserializer)  # a run may lie before the last one read
            got.update((key, t) for _, _, key, t in
                       deserializer.read_tensors(filter_func=keys.__contains__))
    except CryptographyError as exc:
        if isinstance(exc, DecryptionError):  # the load's own, which knows the key was right
            raise
        raise DecryptionError(
            f"could not decrypt {where}: wrong key or passphrase, or encryption settings "
            "that do not match the file") from exc
    missing = [p.entry.name for p in batch if p.entry.key not in got]
    if missing:  # pragma: no cover - tensorizer yields every key asked for
        raise MalformedFileError(f"{where}: tensorizer did not load {', '.join(missing)}")
    return got


def _stream(out: Any, deserializer: Any, planned: list[Planned], where: str,
            progress: Callable[[int], None], chunk: int) -> None:
    for batch in _batches(planned):
        loaded = _load(deserializer, batch, where)
        try:
            for p in batch:
                t = loaded.pop(p.entry.key).detach()
                if t.dtype != p.dtype or tuple(t.shape) != p.entry.shape:
                    raise MalformedFileError(
                        f"{where}: tensor {shown(p.entry.name)} loaded as {t.dtype} "
                        f"{list(t.shape)}, its index says {p.dtype} {list(p.entry.shape)}")
                if p.nbytes:
                    view = byte_view(t.contiguous())
                    for i in range(0, len(view), chunk):
                        out.write(view[i:i + chunk])
                progress(p.nbytes)
                del t
        finally:
            forget(deserializer, {p.entry.key for p in batch})


def write_safetensors(deserializer: Any, planned: list[Planned], where: str, dst: ParsedURI,
                      dst_options: Mapping[str, Any], metadata: Mapping[str, str] | None,
                      overwrite: bool, durable: bool, progress: Callable[[int], None]) -> None:
    """Write ``planned`` (from ``deserializer``) as a safetensors object at ``dst``."""
    header = encode_header([(p.name, SAFETENSORS_NAMES[p.dtype], p.entry.shape, p.nbytes)
                            for p in planned], metadata)
    if dst.is_local:
        # A plain file beside the destination: each tensor written from its own memory
        # (the tensorstream writer would copy it into its buffer first).
        with (local_target(dst.path, overwrite, durable) as tmp, naming_write_errors(dst.path),
              open(tmp, "wb") as out):
            out.write(header)
            _stream(out, deserializer, planned, where, progress, 1 << 62)
        return
    with ts_open(dst, "wb", **dst_options) as out:
        out.write(header)
        _stream(out, deserializer, planned, where, progress, _WRITE_CHUNK)
