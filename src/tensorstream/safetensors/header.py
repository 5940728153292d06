"""The safetensors header: parsed and validated before anything is allocated.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of JSON + the
data. The JSON maps each tensor name to ``{"dtype", "shape",
"data_offsets": [begin, end]}`` (offsets relative to the data, which starts
at ``8 + N``), plus an optional ``"__metadata__"`` of strings.

Everything here is plain Python (no torch): the header of a file that is
hostile or damaged is rejected with :class:`~tensorstream.errors.MalformedFileError`
naming the (redacted) file, before a single tensor byte is allocated or read.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import MalformedFileError

__all__ = ["DTYPE_SIZES", "MAX_HEADER_SIZE", "Header", "TensorInfo", "encode_header",
           "header_from_prefix", "header_length", "parse_header"]

#: safetensors' own limit (``MAX_HEADER_SIZE`` in the Rust crate): 100 MB of JSON.
MAX_HEADER_SIZE = 100_000_000

#: Bytes per element of every dtype tensorstream reads (the ones
#: ``safetensors.torch`` maps to torch, plus E8M0 scales where torch has them).
DTYPE_SIZES: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1, "C64": 8,
    "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2": 1, "F8_E5M2FNUZ": 1, "F8_E8M0": 1,
}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file: ``begin``/``end`` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclasses.dataclass(frozen=True)
class Header:
    """A validated header. ``tensors`` are in file (offset) order."""

    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] | None
    data_start: int

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


def header_length(prefix: bytes, size: int, where: str) -> int:
    """The JSON length from the first 8 bytes, checked against the object ``size``."""
    if size < 8 or len(prefix) < 8:
        raise MalformedFileError(f"{where} is not a safetensors file: {size} bytes, "
                                 "shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_SIZE:
        raise MalformedFileError(f"{where}: header length {n} exceeds the "
                                 f"{MAX_HEADER_SIZE}-byte limit (not a safetensors file?)")
    if 8 + n > size:
        raise MalformedFileError(f"{where} is truncated: the header needs {8 + n} bytes, "
                                 f"the object has {size}", expected_size=8 + n, actual_size=size)
    if n < 2:
        raise MalformedFileError(f"{where}: header length {n} is too short for a JSON object")
    return n


def header_from_prefix(first: bytes, size: int, where: str,
                       read_at: Callable[[int, int], bytes]) -> Header:
    """The validated header of an object of ``size`` bytes that starts with ``first``.

    A header longer than ``first`` is completed with one bounded read,
    ``read_at(offset, nbytes)``, once its length is checked (at most
    :data:`MAX_HEADER_SIZE`, inside the object)."""
    n = header_length(bytes(first[:8]), size, where)
    raw = bytes(first[8 : 8 + n])
    if 8 + n > len(first):  # a header over the first read
        raw += read_at(len(first), 8 + n - len(first))
    return parse_header(raw, size, where)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        _utf8(key)
        out[key] = value
    return out


def _utf8(text: str) -> None:
    """Refuse a string JSON can escape but UTF-8 cannot hold (a lone surrogate, ``"\\ud800"``),
    as safetensors does: a tensor name like that cannot be printed, logged or written out."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the string {text!r} is not valid Unicode (a lone surrogate)") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(raw: bytes, size: int, where: str) -> Header:
    """Validate the JSON header ``raw`` (without its 8-byte length) of an object
    of ``size`` bytes. Raises :class:`MalformedFileError` naming ``where``."""
    data_start = 8 + len(raw)
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedFileError(f"{where}: the header is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise MalformedFileError(f"{where}: the header is not a JSON object")
    metadata: dict[str, str] | None = None
    if "__metadata__" in doc:
        meta = doc.pop("__metadata__")
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise MalformedFileError(f"{where}: __metadata__ must map strings to strings")
        try:
            for v in meta.values():
                _utf8(v)
        except ValueError as exc:
            raise MalformedFileError(f"{where}: __metadata__: {exc}") from None
        metadata = meta
    data_size = size - data_start
    tensors: list[TensorInfo] = []
    for name, entry in doc.items():
        tensors.append(_tensor(name, entry, data_start, data_size, where))
    tensors.sort(key=lambda t: (t.begin, t.end))
    # The tensors must tile the data exactly, as safetensors checks: a gap or trailing
    # bytes is how a damaged header length (a shorter one still parses: the JSON is padded
    # with spaces) or a damaged offset shows, and reading on would shift every tensor.
    last_end, last_name = data_start, None
    for t in tensors:
        if t.begin < last_end:
            raise MalformedFileError(
                f"{where}: tensor {t.name!r} [{t.begin - data_start}, {t.end - data_start}) "
                f"overlaps {last_name!r}")
        if t.begin > last_end:
            raise MalformedFileError(
                f"{where}: tensor {t.name!r} starts at data offset {t.begin - data_start}, "
                f"after a gap of {t.begin - last_end} bytes (the tensors must fill the data)")
        last_end, last_name = t.end, t.name
    if last_end != size:
        raise MalformedFileError(
            f"{where}: {size - last_end} bytes after the last tensor (the header says the "
            f"data is {last_end - data_start} bytes, the object holds {data_size})")
    return Header(tuple(tensors), metadata, data_start)


def _tensor(name: str, entry: Any, data_start: int, data_size: int, where: str) -> TensorInfo:
    if not isinstance(entry, dict):
        raise MalformedFileError(f"{where}: entry {name!r} is not an object")
    # Other fields are ignored, as safetensors does.
    missing = {"dtype", "shape", "data_offsets"} - set(entry)
    if missing:
        raise MalformedFileError(f"{where}: entry {name!r} lacks {', '.join(sorted(missing))}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise MalformedFileError(f"{where}: tensor {name!r} has unsupported dtype {dtype!r}; "
                                 f"known: {', '.join(DTYPE_SIZES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise MalformedFileError(f"{where}: tensor {name!r} has an invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise MalformedFileError(f"{where}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if end > data_size:
        raise MalformedFileError(
            f"{where} is truncated or corrupt: tensor {name!r} ends at data offset {end}, "
            f"the object holds {data_size} bytes of data",
            expected_size=data_start + end, actual_size=data_start + data_size)
    span = end - begin
    # Multiply with an early exit: a hostile shape must not make a huge integer.
    count = 1
    if 0 not in shape:
        for d in shape:
            count *= d
            if count * DTYPE_SIZES[dtype] > span:
                break
    else:
        count = 0
    if count * DTYPE_SIZES[dtype] != span:
        raise MalformedFileError(
            f"{where}: tensor {name!r} of shape {shape} x {dtype} does not fill its "
            f"{span}-byte span")
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


def encode_header(entries: Sequence[tuple[str, str, Sequence[int], int]],
                  metadata: Mapping[str, str] | None) -> bytes:
    """The 8-byte length and the JSON of ``(name, dtype, shape, nbytes)`` entries laid out
    back to back in the given order, padded with spaces to 8 bytes (as safetensors does)."""
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, nbytes in entries:
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    body = json.dumps(doc, separators=(",", ":")).encode()
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body
