"""What a model file holds, from a few bounded ranged reads: :func:`inspect`.

The format comes from the first bytes, not the name: tensorizer's magic
``|TZR|``; a safetensors header (an 8-byte length, then ``{``); or a JSON
object (a ``model.safetensors.index.json``). A folder or prefix (ending in
``/``) is inspected as its checkpoint, as ``tensorstream.safetensors.load``
would read it. Headers are validated by the loaders' own parsers
(:func:`tensorstream.safetensors.header.header_from_prefix`,
:func:`tensorstream.tensorizer.hook.read_index`) before anything is
allocated for them; a truncated or hostile file raises
:class:`~tensorstream.errors.MalformedFileError` naming it. No tensor data
is read.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import os
from typing import Any

from .errors import MalformedFileError, NotFoundError
from .file import StreamReader
from .safetensors.header import header_from_prefix, shown
from .safetensors.sources import (
    Checkpoint,
    Source,
    from_index,
    is_folder,
    missing_shard,
    resolve_checkpoint,
    with_prefix_hint,
)
from .uri import ParsedURI, parse_uri

__all__ = ["ModelInfo", "ModelTensor", "inspect"]

#: The first read of a file: the format's magic and, almost always, the whole header
#: (a larger header takes one more read of exactly its length).
FIRST_READ = 64 << 10
#: Shard headers read at the same time.
_CONCURRENT_FILES = 8
_TZR = b"|TZR|"


@dataclasses.dataclass(frozen=True)
class ModelTensor:
    """One tensor as its file describes it."""

    name: str
    #: the format's dtype name: safetensors ``"BF16"``, tensorizer (torch) ``"bfloat16"``
    dtype: str
    shape: tuple[int, ...]
    #: bytes of data in the file
    nbytes: int
    #: absolute offset of the data in its file
    offset: int
    #: the redacted URI of the file holding it
    file: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "nbytes": self.nbytes, "offset": self.offset, "file": self.file}


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What :func:`inspect` found. ``tensors`` are in file order (file by file)."""

    #: the redacted URI inspected
    uri: str
    #: ``"safetensors"`` or ``"tensorizer"``
    format: str
    tensors: tuple[ModelTensor, ...]
    #: safetensors ``__metadata__`` (of the first file of a checkpoint), else None
    metadata: dict[str, str] | None = None
    #: the ``"metadata"`` object of a checkpoint's index (``{"total_size": ...}``)
    index_metadata: dict[str, Any] | None = None
    #: the redacted URI of every file, and its size in bytes
    files: tuple[tuple[str, int], ...] = ()
    #: tensorizer: tensor data encrypted (names, dtypes and shapes are stored in the clear)
    encrypted: bool = False
    #: tensorizer: the file's data version
    version: int | None = None
    #: bytes read to find all this (every file's header or index, not its tensors)
    bytes_read: int = 0

    @property
    def size(self) -> int:
        """Bytes of every file together."""
        return sum(size for _, size in self.files)

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data."""
        return sum(t.nbytes for t in self.tensors)

    def dtypes(self) -> dict[str, tuple[int, int]]:
        """``dtype -> (tensors, bytes)``, largest share first."""
        count: collections.Counter[str] = collections.Counter()
        nbytes: collections.Counter[str] = collections.Counter()
        for t in self.tensors:
            count[t.dtype] += 1
            nbytes[t.dtype] += t.nbytes
        return {d: (count[d], nbytes[d]) for d in sorted(count, key=lambda d: (-nbytes[d], d))}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``tensorstream inspect --json`` prints)."""
        return {
            "uri": self.uri, "format": self.format, "size": self.size,
            "files": [{"uri": u, "size": s} for u, s in self.files],
            "encrypted": self.encrypted, "version": self.version,
            "metadata": self.metadata, "index_metadata": _json_ready(self.index_metadata),
            "tensors": [t.to_dict() for t in self.tensors],
            "totals": {"tensors": len(self.tensors), "bytes": self.total_bytes,
                       "dtypes": {d: {"tensors": c, "bytes": b}
                                  for d, (c, b) in self.dtypes().items()}},
            "bytes_read": self.bytes_read,
        }


def _json_ready(value: Any) -> Any:
    """``value`` (parsed JSON) with each float JSON cannot hold written as the text Python's
    ``json`` writes for it (``"NaN"``, ``"Infinity"``, ``"-Infinity"``): it reads ``NaN``
    and ``Infinity`` (not JSON) and ``1e999`` (JSON, too large for a float) into floats
    that ``json.dumps`` would print as they are, which no strict JSON parser reads.
    Walked without recursion: an index nests as deep as the parser allows."""
    if not _non_finite(value):
        return value
    root = [value]
    todo: list[tuple[Any, Any]] = [(root, 0)]
    while todo:
        parent, key = todo.pop()
        item = parent[key]
        if isinstance(item, dict):
            parent[key] = item = dict(item)  # copies: the ModelInfo keeps what the file says
            todo += [(item, k) for k in item]
        elif isinstance(item, list):
            parent[key] = item = list(item)
            todo += [(item, i) for i in range(len(item))]
        elif isinstance(item, float) and not math.isfinite(item):
            parent[key] = "NaN" if math.isnan(item) else "Infinity" if item > 0 else "-Infinity"
    return root[0]


def _non_finite(value: Any) -> bool:
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo += item.values()
        elif isinstance(item, list):
            todo += item
        elif isinstance(item, float) and not math.isfinite(item):
            return True
    return False


class _File:
    """One object: its first bytes, and bounded reads of more (counted)."""

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        from .api import open as ts_open

        self.reader: StreamReader = ts_open(uri, "rb", **options)
        self.where = self.reader.name
        self.size = self.reader.size
        self.bytes_read = 0
        try:
            self.first = self.read_at(0, min(self.size, FIRST_READ))
        except BaseException:
            self.reader.close()
            raise

    def read_at(self, offset: int, nbytes: int) -> bytes:
        buf = bytearray(nbytes)
        self.reader.read_ranges([(offset, buf)])
        self.bytes_read += nbytes
        return bytes(buf)

    def close(self) -> None:
        self.reader.close()

    def kind(self) -> str:
        """``"tensorizer"``, ``"safetensors"``, ``"index"`` (JSON) or ``"unknown"``: from
        the first bytes; a damaged file whose bytes say nothing, from its name (so that
        its format's checks say what is wrong with it)."""
        first = self.first
        if first.startswith(_TZR):
            return "tensorizer"
        if len(first) > 8 and first[8:9] == b"{":
            return "safetensors"
        if first.lstrip()[:1] == b"{":
            return "index"
        name = self.where.partition("?")[0]
        if name.endswith(".safetensors"):
            return "safetensors"
        if name.endswith(".tensors"):
            return "tensorizer"
        return "unknown"


def _safetensors(f: _File, names: frozenset[str] | None
                 ) -> tuple[list[ModelTensor], dict[str, str] | None]:
    """The tensors of a safetensors file (those an index puts there), and its metadata."""
    header = header_from_prefix(f.first, f.size, f.where, f.read_at)
    tensors = [t for t in header.tensors if names is None or t.name in names]
    if names is not None and len(tensors) < len(names):
        missing = sorted(names - {t.name for t in tensors})
        raise MalformedFileError(f"{f.where} lacks {len(missing)} tensor(s) that the index puts "
                                 f"there: {', '.join(shown(n) for n in missing[:10])}")
    return ([ModelTensor(t.name, t.dtype, t.shape, t.nbytes, t.begin, f.where) for t in tensors],
            header.metadata)


def _tensorizer(f: _File, uri: str) -> ModelInfo:
    from .tensorizer.hook import read_index

    index = read_index(f.first, f.size, f.where, f.read_at)
    tensors = tuple(ModelTensor(e.name, e.dtype, e.shape, e.nbytes, e.data_offset, f.where)
                    for e in index.entries)
    return ModelInfo(uri, "tensorizer", tensors, files=((f.where, f.size),),
                     encrypted=index.encrypted, version=index.version, bytes_read=f.bytes_read)


def _not_a_model(f: _File) -> MalformedFileError:
    return MalformedFileError(
        f"{f.where} is not a safetensors or tensorizer file, nor a safetensors index "
        f"(it starts with {f.first[:8]!r}; {f.size} bytes)")


def _checkpoint(ckpt: Checkpoint, uri: str, options: dict[str, Any],
                sniffed: int = 0) -> ModelInfo:
    def one(source: Source) -> tuple[list[ModelTensor], int, int, dict[str, str] | None]:
        try:
            f = _File(source.uri, options)
        except NotFoundError as exc:
            hinted = missing_shard(exc, source)
            if hinted is exc:
                raise
            raise hinted from exc
        try:
            if f.kind() != "safetensors":
                if f.kind() == "tensorizer":
                    raise MalformedFileError(f"{f.where} is a tensorizer file, not a safetensors "
                                             "shard")
                raise _not_a_model(f)
            tensors, metadata = _safetensors(f, source.names)
            return tensors, f.size, f.bytes_read, metadata
        finally:
            f.close()

    with concurrent.futures.ThreadPoolExecutor(
            max(1, min(_CONCURRENT_FILES, len(ckpt.sources)))) as pool:
        results = list(pool.map(one, ckpt.sources))
    seen: dict[str, str] = {}
    tensors: list[ModelTensor] = []
    for source, (found, _, _, _) in zip(ckpt.sources, results, strict=True):
        for t in found:
            if t.name in seen:
                raise MalformedFileError(f"tensor {shown(t.name)} is in more than one file: "
                                         f"{seen[t.name]} and {source.where}")
            seen[t.name] = source.where
        tensors += found
    index = ckpt.index
    return ModelInfo(
        index.where if index is not None else uri, "safetensors", tuple(tensors),
        metadata=results[0][3] if results else None,
        index_metadata=index.metadata if index is not None else None,
        files=tuple((s.where, size) for s, (_, size, _, _) in zip(ckpt.sources, results,
                                                                   strict=True)),
        bytes_read=sniffed + (index.size if index is not None else 0)
        + sum(r[2] for r in results))


def inspect(uri: str | os.PathLike[str] | ParsedURI, **options: Any) -> ModelInfo:
    """Describe a model file's tensors (name, dtype, shape, bytes) and metadata, reading only
    its header or index.

    ``uri``: a ``.safetensors`` object, a tensorizer ``.tensors`` object (encrypted
    ones too: their index is in the clear), a ``model.safetensors.index.json`` (each
    shard's header is read, concurrently; each tensor is listed with the shard the index
    names), or a folder/prefix holding one. The format comes from the file's first bytes.
    ``options``: as for :func:`tensorstream.open`. A file that is truncated, malformed or
    not a model raises :class:`~tensorstream.errors.MalformedFileError` naming it.

    >>> info = tensorstream.inspect("s3://models/llama/")  # doctest: +SKIP
    >>> info.total_bytes, info.dtypes()  # doctest: +SKIP
    (16060522496, {'BF16': (291, 16060522496)})
    """
    parsed = parse_uri(uri)
    shown = parsed.redacted()
    if is_folder(parsed):
        return _checkpoint(resolve_checkpoint(parsed, options), shown, options)
    try:
        f = _File(parsed.raw or str(uri), options)
    except NotFoundError as exc:  # "s3://b/llama": a prefix is named with its "/"
        hinted = with_prefix_hint(exc, parsed, "inspect")
        if hinted is exc:
            raise
        raise hinted from exc
    try:
        kind = f.kind()
        if kind == "tensorizer":
            return _tensorizer(f, shown)
        if kind == "safetensors":
            tensors, metadata = _safetensors(f, None)
            return ModelInfo(shown, "safetensors", tuple(tensors), metadata=metadata,
                             files=((f.where, f.size),), bytes_read=f.bytes_read)
        if kind != "index":
            raise _not_a_model(f)
    finally:
        f.close()
    # JSON: an index (its shards are next to it), read whole and validated by the loader's code.
    return _checkpoint(from_index(parsed, options), shown, options, f.bytes_read)

