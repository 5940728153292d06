"""safetensors (one file or the shards of a checkpoint) -> one tensorizer file.

Every shard's header is read and checked first (one bounded ranged read each:
dtypes, names, sizes), so an unsupported tensor is refused before anything
is written. Then each shard is opened again (one at a time), its header
checked to be the same, and read in file order, one tensor at a time with
the next one in flight, and the tensors go to tensorizer's own
``TensorSerializer.write_state_dict`` in batches of :data:`BATCH_BYTES` (it
returns once they are written). Memory: one batch (or one larger tensor),
the tensor being read, and the reader's read-ahead window.

tensorizer seeks back to fill in its header and index, so it writes to a
local file: next to a local destination (published by rename), or in a
temporary directory for a remote one (then streamed up through
``tensorstream.open(uri, "wb")``, atomic at the destination).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from tensorizer import (
    DecryptionParams,
    EncryptionParams,
    TensorDeserializer,
    TensorSerializer,
)
from tensorizer import __version__ as tensorizer_version
from tensorizer.serialization import TensorType

from ..api import open as ts_open
from ..errors import MalformedFileError, ObjectChangedError, UnsupportedOperationError
from ..providers.local.provider import naming_write_errors, temp_copy_hint
from ..safetensors.dtypes import torch_dtype
from ..safetensors.header import TensorInfo, shown
from ..safetensors.opened_file import SafetensorsFile
from ..safetensors.sources import Source
from ..uri import ParsedURI
from ._local import local_target
from .errors import UnsupportedDtypeError

__all__ = ["BATCH_BYTES", "Shard", "empty_round_trips", "no_tensors_round_trip", "plan_shards",
           "write_tensorizer"]

#: Tensors handed to tensorizer at a time (by bytes; a larger tensor alone).
BATCH_BYTES = 64 << 20
_COPY_CHUNK = 16 << 20


@dataclasses.dataclass
class Shard:
    """One safetensors object, its validated header's metadata, and the tensors taken from
    it, in file order."""

    source: Source
    where: str
    tensors: list[TensorInfo]
    metadata: dict[str, str] | None


class _KeptOpen(io.BytesIO):
    def close(self) -> None:  # TensorSerializer.close() closes its file; keep the bytes
        pass


@functools.cache
def empty_round_trips(dtype: torch.dtype, encrypted: bool) -> bool:
    """Whether this tensorizer writes an empty tensor of ``dtype`` and reads it back.

    Asked of tensorizer itself, once per dtype: 2.12 cannot open a file holding an
    empty bf16/fp8 tensor (numpy has no size for its stand-in dtype), nor encrypt an
    empty tensor of any dtype (``memoryview.cast`` of a zero-length shape).
    """
    buf = _KeptOpen()
    key = EncryptionParams.random() if encrypted else None
    try:
        serializer = TensorSerializer(buf, encryption=key)
        serializer.write_tensor(0, "empty", TensorType.STATE_DICT, torch.empty(0, dtype=dtype, device="cpu"))
        serializer.close()
        buf.seek(0)
        decryption = DecryptionParams.from_key(key.key) if key is not None else None
        with TensorDeserializer(buf, device="cpu", encryption=decryption) as back:
            return bool(back["empty"].shape == (0,) and back["empty"].dtype == dtype)
    except Exception:
        return False


@functools.cache
def no_tensors_round_trip() -> bool:
    """Whether this tensorizer reads back a file holding no tensor (2.12 refuses it:
    "Tensor index in the file is empty"), asked of tensorizer itself, once."""
    buf = _KeptOpen()
    try:
        TensorSerializer(buf).close()
        buf.seek(0)
        with TensorDeserializer(buf, device="cpu") as back:
            return len(back) == 0
    except Exception:
        return False


#: tensorizer writes a name's UTF-8 length in 16 bits, and builds tensors through numpy
#: (at most 64 dimensions); an empty name writes, but does not read back.
_MAX_NAME = 0xFFFF
_MAX_DIMS = 64


def _check(t: TensorInfo, where: str, encrypted: bool) -> None:
    dtype = torch_dtype(t.dtype, where)
    if not t.name or len(t.name.encode("utf-8")) > _MAX_NAME:
        raise UnsupportedDtypeError(
            f"{where}: tensorizer cannot hold the tensor name {t.name[:80]!r} (1 to {_MAX_NAME} "
            "bytes of UTF-8); rename the tensor or leave it out of the checkpoint")
    if len(t.shape) > _MAX_DIMS:
        raise UnsupportedDtypeError(
            f"{where}: tensor {shown(t.name)} has {len(t.shape)} dimensions; tensorizer holds at "
            f"most {_MAX_DIMS}")
    if 0 in t.shape and not empty_round_trips(dtype, encrypted):
        why = ("cannot encrypt an empty tensor" if encrypted and empty_round_trips(dtype, False)
               else f"cannot read back a file holding an empty {dtype} tensor")
        raise UnsupportedDtypeError(
            f"{where}: tensor {shown(t.name)} is empty (shape {list(t.shape)}, {t.dtype}) and "
            f"tensorizer {tensorizer_version} {why}; leave the tensor out of the checkpoint"
            + ("" if not encrypted else " or convert without encryption"))


def plan_shards(sources: list[Source], options: Mapping[str, Any],
                encrypted: bool, where: str = "the checkpoint") -> list[Shard]:
    """Every source's header read and validated, before anything is written. Each is
    closed again (a checkpoint can have hundreds of shards: one open at a time)."""
    shards: list[Shard] = []
    seen: dict[str, str] = {}
    for source in sources:
        with SafetensorsFile(source.uri, dict(options), source=source) as f:
            try:
                tensors = f.select(lambda name: True, source.names,
                                   hint="tensorizer holds torch tensors only; leave the "
                                        "tensor out of the checkpoint")
            except UnsupportedOperationError as exc:  # FP6: torch has no dtype for it
                raise UnsupportedDtypeError(exc.message) from None
            for t in tensors:
                if t.name in seen:
                    raise MalformedFileError(
                        f"tensor {shown(t.name)} is in both {seen[t.name]} and {f.where}")
                seen[t.name] = f.where
                _check(t, f.where, encrypted)
            shards.append(Shard(source, f.where, tensors, f.header.metadata))
    if not seen and not no_tensors_round_trip():
        # an index whose weight_map is empty names no shard at all
        if shards:
            where = shards[0].where + (f" (and {len(shards) - 1} more shards)"
                                       if shards[1:] else "")
        raise UnsupportedDtypeError(
            f"{where}: the checkpoint holds no tensor, and tensorizer {tensorizer_version} "
            "cannot read back a file holding none; there is nothing to convert")
    return shards


def _tensors(shard: Shard, options: Mapping[str, Any]) -> Iterator[tuple[TensorInfo, torch.Tensor]]:
    """The shard's tensors in file order; the next one is read while this one is written."""
    if not shard.tensors:
        return
    with SafetensorsFile(shard.source.uri, dict(options)) as f:
        infos = f.select(lambda name: True, shard.source.names)
        if infos != shard.tensors:
            raise ObjectChangedError(f"{f.where} changed while converting (its header is not "
                                     "the one checked before); run the conversion again")
        reader = f.reader
        reader.set_read_boundaries(
            [f.header.data_start, *(x for t in infos for x in (t.begin, t.end))])
        with reader.fork(end=infos[-1].end) as fork, concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="tensorstream-convert") as pool:
            pending = pool.submit(f.read_tensor, infos[0], fork)
            try:
                for i, info in enumerate(infos):
                    tensor = pending.result()
                    if i + 1 < len(infos):
                        pending = pool.submit(f.read_tensor, infos[i + 1], fork)
                    yield info, tensor
                    del tensor
            finally:
                pending.cancel()


def _serialize(shards: list[Shard], options: Mapping[str, Any], path: str, encryption: Any,
               progress: Callable[[int], None]) -> int:
    count = 0
    batch: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal size
        # write_state_dict: STATE_DICT entries named as in the checkpoint (what
        # tensorstream.serialize(state_dict) writes and vLLM's weight iterator reads); a
        # batch lets tensorizer hash one tensor while it writes another.
        serializer.write_state_dict(batch)
        for t in batch.values():
            progress(t.numel() * t.element_size())
        batch.clear()
        size = 0

    with open(path, "wb+") as out:
        serializer = TensorSerializer(out, encryption=encryption)
        try:
            for shard in shards:
                for info, tensor in _tensors(shard, options):
                    batch[info.name] = tensor
                    size += info.nbytes
                    count += 1
                    del tensor
                    if size >= BATCH_BYTES:
                        flush()
            if batch:
                flush()
        except BaseException:
            batch.clear()
            with contextlib.suppress(Exception):
                serializer.close()
            raise
        serializer.close()  # closes ``out`` too
    return count


def write_tensorizer(shards: list[Shard], src_options: Mapping[str, Any], dst: ParsedURI,
                     dst_options: Mapping[str, Any], encryption: Any, overwrite: bool,
                     durable: bool, progress: Callable[[int], None]) -> int:
    """Write every tensor of ``shards`` to ``dst``; returns the number of tensors."""
    if dst.is_local:
        with local_target(dst.path, overwrite, durable) as tmp, naming_write_errors(dst.path):
            return _serialize(shards, src_options, tmp, encryption, progress)
    with tempfile.TemporaryDirectory(prefix="tensorstream-convert-") as tmpdir:
        tmp = os.path.join(tmpdir, "model.tensors")
        with naming_write_errors(tmp, temp_copy_hint("convert", dst)):
            count = _serialize(shards, src_options, tmp, encryption, progress)
        with open(tmp, "rb") as src, ts_open(dst, "wb", **dst_options) as out:
            shutil.copyfileobj(src, out, _COPY_CHUNK)
    return count
