"""Which objects a safetensors URI names: one file, or the shards of a checkpoint.

* ``.../model.safetensors`` (anything else that is an object): one file;
* ``.../model.safetensors.index.json``: the shards its ``weight_map`` names,
  each next to the index, each tensor taken from the shard the index names;
* a folder or prefix (a local directory, or a URI ending in ``/``): its
  ``*.safetensors.index.json`` if it holds one, else every ``*.safetensors``
  directly inside it.

An index is hostile input too: shard names that leave the index's folder
(``..``, absolute paths, URIs) are refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import urllib.parse
from typing import Any

from .. import _loop
from ..api import get_provider
from ..api import open as ts_open
from ..errors import MalformedFileError, NotFoundError, UnsupportedOperationError
from ..uri import ParsedURI, is_utf8, parse_uri
from .header import shown

__all__ = ["INDEX_SUFFIX", "Checkpoint", "Index", "Source", "from_index", "is_folder",
           "load_index", "missing_shard", "resolve", "resolve_checkpoint", "with_prefix_hint"]

#: Shards of a checkpoint read at the same time.
MAX_CONCURRENT_FILES = 4

INDEX_SUFFIX = ".safetensors.index.json"
#: An index is JSON of names; anything this large is not one.
MAX_INDEX_SIZE = 100_000_000
#: Distinct shards an index may name: real checkpoints have tens to a few hundred;
#: a hostile index naming 100k would have every one opened (or probed) first.
MAX_SHARDS = 10_000


@dataclasses.dataclass(frozen=True)
class Source:
    """One safetensors object; ``names``: the tensors the index takes from it (None: all);
    ``index``: the redacted URI of that index."""

    uri: str
    where: str
    names: frozenset[str] | None = None
    index: str | None = None


def _sibling(parsed: ParsedURI, name: str) -> str:
    """The URI of ``name`` next to ``parsed`` (secrets kept).

    HTTP(S) keeps the index URI's query string and user info: a token or a
    signature in the query (``?token=...``, a storage SAS) usually grants the
    whole folder, and a shard without it is refused. (A presigned S3 URL signs
    one key only: such shards need URIs of their own.)
    """
    if parsed.scheme == "file":
        return os.path.join(os.path.dirname(parsed.path), name)
    if parsed.scheme in ("http", "https"):
        parts = urllib.parse.urlsplit(parsed.raw)
        folder = posixpath.dirname(parts.path)
        return urllib.parse.urlunsplit(parts._replace(
            path=posixpath.join(folder, urllib.parse.quote(name, safe="/")), fragment=""))
    return parsed.with_path(posixpath.join(posixpath.dirname(parsed.path), name))


def _check_shard_name(name: Any, where: str) -> str:
    if (not isinstance(name, str) or not name or name.startswith(("/", "\\"))
            or "\\" in name or "://" in name or "?" in name or "#" in name or "\0" in name
            or not is_utf8(name)
            or any(part in ("", ".", "..") for part in name.split("/"))):
        raise MalformedFileError(f"{where}: shard name {shown(name)} is not a file name next to the index")
    return name


@dataclasses.dataclass(frozen=True)
class Index:
    """A validated ``model.safetensors.index.json``."""

    #: tensor name -> shard file name (next to the index)
    weight_map: dict[str, str]
    #: the index's own ``"metadata"`` object (``{"total_size": ...}``), or None
    metadata: dict[str, Any] | None
    #: the redacted index URI
    where: str
    #: bytes of the index object
    size: int = 0


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a URI stands for: its files, and the index that named them (if any)."""

    sources: list[Source]
    index: Index | None = None


def read_index(uri: str | ParsedURI, options: dict[str, Any]) -> tuple[dict[str, str], str]:
    """The validated ``weight_map`` of an index, and the redacted index URI."""
    index = load_index(uri, options)
    return index.weight_map, index.where


def load_index(uri: str | ParsedURI, options: dict[str, Any]) -> Index:
    """Read and validate an index (at most :data:`MAX_INDEX_SIZE` bytes)."""
    with ts_open(uri, "rb", **options) as f:
        where = f.name
        if f.size > MAX_INDEX_SIZE:
            raise MalformedFileError(f"{where}: {f.size} bytes is too large for an index")
        raw = f.read()
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_one_value_per_key)
    except _TwoValues as exc:
        key, first, second = exc.args
        raise MalformedFileError(f"{where}: {shown(key)} is given twice, with {shown(first)} "
                                 f"and {shown(second)}: which one is meant is unknowable") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedFileError(f"{where}: not a JSON index ({exc})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
        raise MalformedFileError(f"{where}: no weight_map object mapping tensor names to shards")
    for shard in weight_map.values():
        _check_shard_name(shard, where)
    shards = len(set(weight_map.values()))
    if shards > MAX_SHARDS:
        raise MalformedFileError(f"{where}: the weight_map names {shards} distinct shard files, "
                                 f"more than the {MAX_SHARDS} any checkpoint has")
    meta = doc.get("metadata")
    return Index(weight_map, meta if isinstance(meta, dict) else None, where, len(raw))


class _TwoValues(ValueError):
    """A key given twice in one object with two values: ``(key, first, second)``."""


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An index's objects, refusing a key given twice with two values: json keeps the
    last, so a weight_map naming a tensor's shard twice loaded whichever came last."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and out[key] != value:
            raise _TwoValues(key, out[key], value)
        out[key] = value
    return out


def from_index(parsed: ParsedURI, options: dict[str, Any]) -> Checkpoint:
    index = load_index(parsed, options)
    shards: dict[str, set[str]] = {}
    for tensor, shard in index.weight_map.items():
        shards.setdefault(shard, set()).add(tensor)
    out = []
    for shard in sorted(shards):
        uri = _sibling(parsed, shard)
        out.append(Source(uri, parse_uri(uri).redacted(), frozenset(shards[shard]), index.where))
    return Checkpoint(out, index)


def missing_shard(exc: NotFoundError, source: Source) -> NotFoundError:
    """``exc`` (``source`` not found) naming the index that puts tensors there, and which:
    "no such file" of a shard said neither (a download or a copy cut short)."""
    if source.index is None or not source.names:
        return exc
    names = sorted(source.names)
    listed = ", ".join(shown(n) for n in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    plural = "s" if len(names) > 1 else ""
    out = NotFoundError(f"{exc}; {source.index} puts {len(names)} tensor{plural} there: "
                        f"{listed}{more}. Copy the missing shard next to the index, or load "
                        "a complete copy of the checkpoint")
    out.__cause__ = exc
    return out


async def _list(parsed: ParsedURI, prefix: str, options: dict[str, Any]) -> list[str]:
    async with get_provider(parsed, **options) as provider:
        return [info.path async for info in provider.list(prefix)]


def _local_children(folder: str) -> list[str]:
    # Symbolic links are followed (is_file): a Hugging Face cache snapshot is links into
    # blobs/, which the provider's listing (regular files only) leaves out. A link to
    # nothing (its blob deleted, or never downloaded) is kept: opening it says it is not
    # found, where leaving it out loaded the checkpoint without its tensors.
    with os.scandir(folder) as entries:
        return [e.path for e in entries if not e.name.startswith(".") and (
            e.is_file() or (e.is_symlink() and not os.path.exists(e.path)))]


#: A shard's name in a set of numbered shards: ``model-00001-of-00004.safetensors``.
_NUMBERED = re.compile(r"(?P<stem>.*)-(?P<n>\d+)-of-(?P<total>\d+)\.safetensors")


def _refuse_missing_shards(files: list[str], where: str) -> None:
    """Raise :class:`NotFoundError` when ``files`` (a folder's, without an index) hold
    some shards of a numbered set (``-0000N-of-0000M``, N from 1, or from 0 where a
    ``-00000-`` is there) and not the others: a download or a copy cut short loaded
    what it held, without the missing shards' tensors. A shard numbered past its set
    (``-00005-of-00004``) is a :class:`MalformedFileError` naming it."""
    sets: dict[tuple[str, str], set[int]] = {}
    for path in files:
        m = _NUMBERED.fullmatch(path.replace(os.sep, "/").rsplit("/", 1)[-1])
        if m is not None:
            sets.setdefault((m["stem"], m["total"]), set()).add(int(m["n"]))
    for (stem, total), numbers in sorted(sets.items()):
        count = int(total)
        if count > MAX_SHARDS:
            continue
        # Numbered from 0 where -00000- is there, from 1 where -0000M-of-0000M is; with
        # neither (a set from 0 without its first shard, one from 1 without its last),
        # the names cannot tell: both readings' missing shards are named.
        readings = [0] if 0 in numbers else [1] if count in numbers else [1, 0]
        # A shard numbered past the set (-00005-of-00004; -00004-of-00004 beside -00000-)
        # is in no set of that many: loading it as one more file mixed another model in.
        past = sorted(n for n in numbers if n > count - 1 + min(readings))
        if past:
            first = min(readings)
            raise MalformedFileError(
                f"{where} holds {_listed(stem, total, past)}, numbered past the "
                f"{count} shards of its set ({first}-{count - 1 + first}): a shard of another "
                "checkpoint, or a misnamed file? Remove or rename it, or name the files "
                "(or the model.safetensors.index.json) to load")
        missing = [sorted(set(range(first, count + first)) - numbers) for first in readings]
        if not missing[0]:
            continue
        names = [_listed(stem, total, m) for m in missing]
        alternative = f" (or, if the set is numbered from 0, {names[1]})" if len(names) > 1 else ""
        raise NotFoundError(
            f"{where} holds {len(numbers)} of the {count} shards "
            f"{shown(stem + '-*-of-' + total + '.safetensors')}, not {names[0]}{alternative}. "
            "Copy the missing shards (or the model.safetensors.index.json that names them), "
            "or name the files to load")


def _listed(stem: str, total: str, numbers: list[int]) -> str:
    """The shards ``numbers`` of a set, named: the first five, then how many more."""
    names = [shown(f"{stem}-{n:0{len(total)}d}-of-{total}.safetensors") for n in numbers[:5]]
    more = f" and {len(numbers) - 5} more" if len(numbers) > 5 else ""
    return ", ".join(names) + more


def _from_folder(parsed: ParsedURI, options: dict[str, Any]) -> Checkpoint:
    sep = os.sep if parsed.scheme == "file" else "/"
    prefix = parsed.path.rstrip(sep) + sep
    try:
        paths = (_local_children(prefix) if parsed.scheme == "file"
                 else _loop.run_sync(_list(parsed, prefix, options)))
    except UnsupportedOperationError as exc:
        raise UnsupportedOperationError(
            f"{parsed.redacted()} is not an object and {parsed.scheme} cannot list a folder: "
            "give the .safetensors or the model.safetensors.index.json URI") from exc
    children = sorted(p for p in paths if p.startswith(prefix) and sep not in p[len(prefix):])
    indexes = [p for p in children if p.endswith(INDEX_SUFFIX)]
    if indexes:
        preferred = [p for p in indexes if p.endswith(sep + "model" + INDEX_SUFFIX)]
        if len(indexes) > 1 and not preferred:
            raise MalformedFileError(f"{parsed.redacted()} holds several indexes "
                                     f"({', '.join(p[len(prefix):] for p in indexes)}); name one")
        return from_index(parse_uri(parsed.with_path((preferred or indexes)[0])), options)
    files = [p for p in children if p.endswith(".safetensors")]
    if not files:
        raise NotFoundError(f"no model.safetensors.index.json or *.safetensors in "
                            f"{parsed.redacted()}")
    _refuse_missing_shards(files, parsed.redacted())
    out = []
    for p in files:
        uri = parsed.with_path(p)
        out.append(Source(uri, parse_uri(uri).redacted()))
    return Checkpoint(out)


def with_prefix_hint(exc: NotFoundError, parsed: ParsedURI, verb: str) -> NotFoundError:
    """``exc`` (``parsed`` opened as an object, not found), saying to end the URI with '/'
    where it may name a prefix: ``s3://b/llama`` (as for ``cp -r``). Not for a local path
    (a folder is seen as one), HTTP (which cannot list) or a model file's name."""
    path = parsed.path.partition("?")[0] if parsed.scheme in ("http", "https") else parsed.path
    if parsed.scheme in ("file", "http", "https") or posixpath.basename(path).endswith(
            (".safetensors", ".tensors", ".json")):
        return exc
    hinted = NotFoundError(f"{exc}; to {verb} the checkpoint in a folder or prefix, end it "
                           f"with '/': {parsed.redacted()}/")
    hinted.__cause__ = exc
    return hinted


def resolve(uri: str | os.PathLike[str] | ParsedURI, options: dict[str, Any]) -> list[Source]:
    """The safetensors objects ``uri`` stands for (see the module docstring)."""
    return resolve_checkpoint(uri, options).sources


def is_folder(parsed: ParsedURI) -> bool:
    """Whether ``parsed`` names a folder or prefix (a local directory, or ends in a separator)."""
    return parsed.path.endswith(("/", os.sep)) or (parsed.scheme == "file"
                                                   and os.path.isdir(parsed.path))


def resolve_checkpoint(uri: str | os.PathLike[str] | ParsedURI,
                       options: dict[str, Any]) -> Checkpoint:
    """Like :func:`resolve`, with the index that named the files (if any)."""
    parsed = parse_uri(uri)
    path = parsed.path.partition("?")[0] if parsed.scheme in ("http", "https") else parsed.path
    if path.endswith(".json"):
        return from_index(parsed, options)
    if is_folder(parsed):
        return _from_folder(parsed, options)
    return Checkpoint([Source(parsed.raw or str(uri), parsed.redacted())])
