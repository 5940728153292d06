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
import functools
import json
import math
import re
import reprlib
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from ..errors import ConfigurationError, MalformedFileError
from ..uri import is_utf8

__all__ = ["DTYPE_BITS", "DTYPE_SIZES", "MAX_HEADER_SIZE", "Header", "TensorInfo", "encode_header",
           "header_from_prefix", "header_length", "parse_header", "shown"]

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

#: Bits per element of every dtype a header may give: those of :data:`DTYPE_SIZES`;
#: F4 (FP4 E2M1), two to a byte, that safetensors reads as torch's ``float4_e2m1fn_x2``;
#: and FP6 (four to three bytes), whose headers safetensors reads (``safe_open`` lists the
#: file and reads its other tensors) though torch has no dtype for them.
DTYPE_BITS: dict[str, int] = {**{k: 8 * v for k, v in DTYPE_SIZES.items()}, "F4": 4,
                              "F6_E2M3": 6, "F6_E3M2": 6}


@dataclasses.dataclass(frozen=True, slots=True)  # a header may list a million of them
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

    @functools.cached_property
    def _by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    def by_name(self) -> dict[str, TensorInfo]:
        """Tensor name -> its entry (built once: ``open(...).get_tensor`` asks per tensor,
        and a dict per call made reading every tensor of a file quadratic)."""
        return self._by_name


def header_length(prefix: bytes, size: int, where: str) -> int:
    """The JSON length from the first 8 bytes, checked against the object ``size``."""
    if size < 8 or len(prefix) < 8:
        raise MalformedFileError(f"{where} is not a safetensors file: {size} bytes, "
                                 "shorter than the 8-byte header length")
    if prefix[:5] == b"|TZR|":  # tensorizer's magic: the other format, not a damaged file
        raise MalformedFileError(
            f"{where} is a tensorizer file, not a safetensors file: load it with "
            "tensorstream.deserialize(uri) (or load_into_module), or convert it with "
            "tensorstream convert SRC DST.safetensors")
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


def _utf8(text: str) -> None:
    """Refuse a string JSON can escape but UTF-8 cannot hold (a lone surrogate, ``"\\ud800"``),
    as safetensors does: a tensor name like that cannot be printed, logged or written out."""
    if not is_utf8(text):
        raise ValueError(f"the string {shown(text)} is not valid Unicode (a lone surrogate)")


_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 160, 160, 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = 16


def shown(value: Any) -> str:
    """``repr(value)`` cut short (``'xx...xx'``, ``[1, 2, ...]``) for a message: a hostile
    header's name, dtype or shape can be megabytes, and a message, a log line and the
    CLI's error repeat it whole (a 20 MB dtype made a 20 MB error line)."""
    return _SHOWN.repr(value)


#: The most elements a shape may count (torch's sizes are int64).
_MAX_ELEMENTS = 2**63 - 1

#: Stands for the tensor's name in the message of an entry checked before its name is known.
_NAME = "\x00name\x00"


class _Checked(tuple[str, tuple[int, ...], int, int]):
    """An entry checked where the JSON parser built it: ``(dtype, shape, begin, end)``
    (offsets relative to the data), in place of a dict of lists (~5x the memory)."""

    __slots__ = ()


class _Refused:
    """An entry that failed its check; raised, with its name, once the name is known."""

    __slots__ = ("error",)

    def __init__(self, error: MalformedFileError) -> None:
        self.error = error

    def raise_for(self, name: str) -> NoReturn:
        err = self.error
        raise MalformedFileError(err.message.replace(_NAME, shown(name)),
                                 expected_size=err.expected_size, actual_size=err.actual_size)


#: What a parsed value is when its object is not a tensor entry (a string: metadata).
_NOT_ENTRY = (str, _Checked, _Refused)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_ABSENT = object()


def _hook(data_start: int, data_size: int, where: str,
          surrogates: bool) -> Callable[[list[tuple[str, Any]]], Any]:
    """The parser's ``object_pairs_hook``: refuses a repeated key or one UTF-8 cannot
    hold in any object, and checks each tensor entry as soon as it is parsed.

    Why: a 100 MB header (safetensors' own cap) of small entries took ~2 GB as dicts
    of lists, then as much again in :class:`TensorInfo`. An object is taken for an
    entry when it has ``data_offsets``, holds no entry itself (the top level) and is
    not all strings (``__metadata__``); any other object stays a dict and is checked
    as before, with the same messages. ``surrogates``: whether the text may hold a
    lone surrogate (a ``\\uD800``-``\\uDFFF`` escape): the only way JSON text that
    is valid UTF-8 makes a key UTF-8 cannot hold."""
    def hook(pairs: list[tuple[str, Any]]) -> Any:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise ValueError(f"duplicate key {shown(key)}")
                seen.add(key)
        if surrogates:
            for key in out:
                _utf8(key)
        offsets = out.get("data_offsets", _ABSENT)
        if offsets is _ABSENT or type(offsets) in _NOT_ENTRY or any(
                type(v) in _NOT_ENTRY[1:] for v in out.values()):
            return out
        try:
            return _Checked(_entry(_NAME, out, data_start, data_size, where))
        except MalformedFileError as exc:
            return _Refused(exc)

    return hook


def _not_json(name: str) -> NoReturn:
    """Refuse ``NaN``, ``Infinity`` and ``-Infinity``, which Python's json reads and JSON
    (and safetensors) does not: a header holding one loaded here and nowhere else."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON float, refused past the largest double (``1e999``), as safetensors refuses it
    (Python's json made it ``inf``)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {shown(text)} is out of range")
    return value


#: ``-0`` outside a string (a string holding it only costs the slower parse below).
_NEGATIVE_ZERO = re.compile(r"-0(?![0-9.eE])")


def _int(text: str) -> int | float:
    """A JSON integer, where ``-0`` is the float ``-0.0``, as safetensors (serde) reads it:
    a shape or ``data_offsets`` holding ``-0`` is refused there (not an unsigned integer),
    and loaded here as 0 (a file that loaded here and nowhere else)."""
    return -0.0 if text == "-0" else int(text)


def parse_header(raw: bytes, size: int, where: str) -> Header:
    """Validate the JSON header ``raw`` (without its 8-byte length) of an object
    of ``size`` bytes. Raises :class:`MalformedFileError` naming ``where``."""
    data_start = 8 + len(raw)
    data_size = size - data_start
    try:
        text = raw.decode("utf-8")
        surrogates = _SURROGATE.search(text) is not None
        # (the C parser reads integers itself unless given parse_int: only when it matters)
        parse_int = _int if _NEGATIVE_ZERO.search(text) else None
        doc = json.loads(text, object_pairs_hook=_hook(data_start, data_size, where, surrogates),
                         parse_constant=_not_json, parse_float=_finite, parse_int=parse_int)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedFileError(f"{where}: the header is not valid JSON ({exc})") from None
    del text
    if isinstance(doc, _Checked | _Refused):
        raise MalformedFileError(f"{where}: the header is a tensor entry, not an object "
                                 "mapping tensor names to entries")
    if not isinstance(doc, dict):
        raise MalformedFileError(f"{where}: the header is not a JSON object")
    metadata: dict[str, str] | None = None
    # ``null`` is no metadata, as safetensors reads it (an optional field).
    if doc.get("__metadata__", _ABSENT) is None:
        del doc["__metadata__"]
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
    tensors: list[TensorInfo] = []
    for name in list(doc):
        entry = doc.pop(name)  # each entry's parse is dropped as its TensorInfo is made
        if isinstance(entry, _Refused):
            entry.raise_for(name)
        dtype, shape, begin, end = (entry if isinstance(entry, _Checked)
                                    else _entry(shown(name), entry, data_start, data_size, where))
        tensors.append(TensorInfo(name, dtype, shape, data_start + begin, data_start + end))
    tensors.sort(key=lambda t: (t.begin, t.end))
    # The tensors must tile the data exactly, as safetensors checks: a gap or trailing
    # bytes is how a damaged header length (a shorter one still parses: the JSON is padded
    # with spaces) or a damaged offset shows, and reading on would shift every tensor.
    last_end, last_name = data_start, None
    for t in tensors:
        if t.begin < last_end:
            raise MalformedFileError(
                f"{where}: tensor {shown(t.name)} [{t.begin - data_start}, {t.end - data_start}) "
                f"overlaps {shown(last_name)}")
        if t.begin > last_end:
            raise MalformedFileError(
                f"{where}: tensor {shown(t.name)} starts at data offset {t.begin - data_start}, "
                f"after a gap of {t.begin - last_end} bytes (the tensors must fill the data)")
        last_end, last_name = t.end, t.name
    if last_end != size:
        raise MalformedFileError(
            f"{where}: {size - last_end} bytes after the last tensor (the header says the "
            f"data is {last_end - data_start} bytes, the object holds {data_size})")
    return Header(tuple(tensors), metadata, data_start)


def _entry(name: str, entry: Any, data_start: int, data_size: int,
           where: str) -> tuple[str, tuple[int, ...], int, int]:
    """``(dtype, shape, begin, end)`` of a checked entry (offsets relative to the
    data); ``name`` is how messages show the tensor (:func:`shown`)."""
    if not isinstance(entry, dict):
        raise MalformedFileError(f"{where}: entry {name} is not an object")
    # Other fields are ignored, as safetensors does.
    missing = {"dtype", "shape", "data_offsets"} - set(entry)
    if missing:
        raise MalformedFileError(f"{where}: entry {name} lacks {', '.join(sorted(missing))}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise MalformedFileError(f"{where}: tensor {name} has unsupported dtype {shown(dtype)}; "
                                 f"known: {', '.join(DTYPE_BITS)}")
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        raise MalformedFileError(f"{where}: tensor {name} has an invalid shape {shown(shape)}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise MalformedFileError(f"{where}: tensor {name} has invalid data_offsets {shown(offsets)}")
    begin, end = offsets
    if end > data_size:
        raise MalformedFileError(
            f"{where} is truncated or corrupt: tensor {name} ends at data offset {end}, "
            f"the object holds {data_size} bytes of data",
            expected_size=data_start + end, actual_size=data_start + data_size)
    span, bits = end - begin, DTYPE_BITS[dtype]
    # Multiply with an early exit: a hostile shape must not make a huge integer.
    # (In bits: an F4 tensor of an odd element count ends inside a byte, and fills no span.)
    count = 1
    if 0 not in shape:
        for d in shape:
            count *= d
            if count * bits > 8 * span:
                break
    else:
        # An empty tensor fills any 0-byte span, but torch still needs its element count
        # without the zeros to fit an int64 (``[2**63, 0]`` made torch raise a bare TypeError,
        # ``[2**62, 4, 0]`` a RuntimeError); safetensors refuses such a shape too.
        for d in shape:
            count *= d or 1
            if count > _MAX_ELEMENTS:
                raise MalformedFileError(
                    f"{where}: tensor {name} has a shape {shown(shape)} whose dimensions overflow "
                    "a 64-bit element count")
        count = 0
    if count * bits != 8 * span:
        raise MalformedFileError(
            f"{where}: tensor {name} of shape {shown(shape)} x {dtype} does not fill its "
            f"{span}-byte span")
    return dtype, tuple(shape), begin, end


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
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()  # (as safetensors)
    body += b" " * (-(8 + len(body)) % 8)
    if len(body) > MAX_HEADER_SIZE:  # a file every safetensors reader refuses
        raise ConfigurationError(
            f"the safetensors header of {len(body)} bytes ({len(entries)} tensors) is over the "
            f"{MAX_HEADER_SIZE}-byte limit safetensors readers enforce: save less metadata, "
            "or split the tensors into shards")
    return struct.pack("<Q", len(body)) + body
