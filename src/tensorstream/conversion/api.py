"""``tensorstream.convert(src, dst)``: safetensors <-> tensorizer on any backend, streamed.

The source's format is read from its first bytes (tensorizer files start
with ``|TZR|``); an index (``*.safetensors.index.json``) or a folder/prefix
is a safetensors checkpoint. The destination gets the other format.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import _loop
from ..api import get_provider
from ..api import open as ts_open
from ..errors import ConfigurationError, MalformedFileError, NotFoundError, UnsupportedOperationError
from ..providers.local.writer import check_destination as check_local_destination
from ..safetensors.header import header_length, shown
from ..safetensors.sources import with_prefix_hint
from ..uri import ParsedURI, is_utf8, parse_uri
from .errors import DestinationExistsError

__all__ = ["ConvertResult", "convert", "source_format"]

TENSORIZER_MAGIC = b"|TZR|"
SAFETENSORS, TENSORIZER = "safetensors", "tensorizer"
_SUFFIX = {SAFETENSORS: ".safetensors", TENSORIZER: ".tensors"}


@dataclasses.dataclass
class ConvertResult:
    """What :func:`convert` wrote.

    ``src``/``dst`` are redacted URIs; ``bytes`` counts tensor data (headers
    aside); ``encrypted``: the tensorizer side (destination or source) is
    encrypted; ``notes`` says what the target format could not keep
    (safetensors metadata in a tensorizer file).
    """

    src: str
    dst: str
    src_format: str
    dst_format: str
    tensors: int
    bytes: int
    seconds: float
    encrypted: bool
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _path(parsed: ParsedURI) -> str:
    return parsed.path.partition("?")[0] if parsed.scheme in ("http", "https") else parsed.path


def _is_folder(parsed: ParsedURI) -> bool:
    # a local path loses its trailing "/" when parsed: ask the text as given too
    path, raw = _path(parsed), parsed.raw.partition("?")[0]
    return (path.endswith(("/", os.sep)) or raw.endswith(("/", os.sep))
            or (parsed.scheme == "file" and os.path.isdir(path)))


def source_format(src: str | os.PathLike[str] | ParsedURI, options: Mapping[str, Any]) -> str:
    """``"safetensors"`` or ``"tensorizer"``: an index or folder is safetensors, an object
    is tensorizer when it starts with tensorizer's magic bytes."""
    parsed = parse_uri(src)
    if _path(parsed).endswith(".json") or _is_folder(parsed):
        return SAFETENSORS
    try:
        f = ts_open(parsed, "rb", **options)
    except NotFoundError as exc:
        hinted = with_prefix_hint(exc, parsed, "convert")
        if hinted is exc:
            raise
        raise hinted from exc
    with f:
        head = bytearray(min(f.size, 8))
        if head:
            f.read_ranges([(0, head)])
        size, where = f.size, f.name
    if bytes(head[:len(TENSORIZER_MAGIC)]) == TENSORIZER_MAGIC:
        return TENSORIZER
    # Neither format's start (a damaged magic, not a model at all): said here, or a source
    # named *.tensors was taken for safetensors and refused for the destination's name.
    try:
        header_length(bytes(head), size, where)
    except MalformedFileError as exc:
        raise MalformedFileError(
            f"{exc.message}; not a tensorizer file either (it does not start with "
            f"{TENSORIZER_MAGIC!r})", expected_size=exc.expected_size,
            actual_size=exc.actual_size) from None
    return SAFETENSORS


def _stem(parsed: ParsedURI) -> str:
    path = _path(parsed).rstrip("/" + os.sep)
    base = os.path.basename(path) if parsed.scheme == "file" else posixpath.basename(path)
    if _is_folder(parsed) or base.endswith(".json"):
        return "model"
    for suffix in (".safetensors", ".tensors"):
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[: -len(suffix)]
    return base or "model"


def _destination(src: ParsedURI, dst: ParsedURI, target: str) -> ParsedURI:
    """``dst``, or ``dst/<source name>.<target suffix>`` when ``dst`` is a folder."""
    suffix = _SUFFIX[target]
    if _is_folder(dst):
        name = _stem(src) + suffix
        sep = os.sep if dst.scheme == "file" else "/"
        return parse_uri(dst.with_path(dst.path.rstrip(sep) + sep + name))
    path = _path(dst)
    other = SAFETENSORS if target == TENSORIZER else TENSORIZER
    # ".safetensors" ends with ".tensors" too
    if path.endswith(".safetensors") if other == SAFETENSORS else (
            path.endswith(".tensors") and not path.endswith(".safetensors")):
        raise ConfigurationError(
            f"{dst.redacted()} names a {other} file, but converting {src.redacted()} makes a "
            f"{target} file (name it *{suffix}); to copy a file as it is, use tensorstream cp")
    return dst


def _identity(parsed: ParsedURI) -> tuple[str, str, str, list[tuple[str, str]]]:
    """What names ``parsed``'s object: never shown (secrets in it)."""
    # netloc holds no user info for the dedicated backends (http, s3, redis), all of it
    # for fsspec's, whose path keeps it too.
    return parsed.scheme, parsed.netloc, parsed.path, sorted(parsed.query.items())


def _same_object(src: ParsedURI, dst: ParsedURI) -> bool:
    """Whether writing ``dst`` would replace ``src``: the same text, or for local files the
    same file under another spelling (``./m``, ``file:///abs/m``, ``sub/../m``, a linked
    folder; the conversion would replace the source with its conversion). The last part of
    ``dst`` is not followed: a symlink there is replaced, not written through.

    Compared as given, secrets included (``?token=A`` and ``?token=B`` may name two
    objects, though both show as ``?token=***``), but without the user info of a dedicated
    backend's URI: credentials pick who reads, not what (one Redis key as ``:pw@`` and as
    ``user:pw@``). An fsspec URI is compared whole: its filesystem reads the path."""
    if _identity(dst) == _identity(src):
        return True
    if src.scheme != "file" or dst.scheme != "file":
        return False
    folder, name = os.path.split(dst.path)
    return os.path.realpath(src.path) == os.path.join(os.path.realpath(folder), name)


async def _check_writable(dst: ParsedURI, options: Mapping[str, Any], overwrite: bool) -> None:
    """Refuse a destination that cannot be written, or exists (unless ``overwrite``), before
    anything is read: a conversion is not wasted on a read-only backend."""
    async with get_provider(dst, **options) as provider:
        if not provider.capabilities.write:
            raise UnsupportedOperationError(
                f"{dst.redacted()}: {getattr(provider, 'service', dst.scheme)} destinations "
                "cannot be written; convert to a local path, s3:// or redis://")
        if dst.scheme == "file":
            # a directory (or a FIFO, a device) cannot be replaced: refused now, not after
            # the whole conversion ran (--overwrite would not help)
            check_local_destination(dst.path)
        if overwrite:
            return
        if dst.scheme == "file":
            exists = os.path.lexists(dst.path)
        else:
            try:
                await provider.stat(dst.path)
            except NotFoundError:
                return
            exists = True
        if exists:
            raise DestinationExistsError(
                f"{dst.redacted()} exists; pass --overwrite (overwrite=True) to replace it")


def convert(
    src: str | os.PathLike[str] | ParsedURI,
    dst: str | os.PathLike[str] | ParsedURI,
    *,
    encryption: Any = None,
    overwrite: bool = False,
    durable: bool = True,
    metadata: Mapping[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    verify_hash: bool | None = None,
    src_options: Mapping[str, Any] | None = None,
    dst_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> ConvertResult:
    """Convert a safetensors checkpoint to a tensorizer file, or a tensorizer file to safetensors.

    ``src``: a ``.safetensors`` object, a ``model.safetensors.index.json``
    (every shard it names), a folder/prefix holding one, or a ``.tensors``
    file, on any backend. ``dst``: the object to write, on any writable
    backend (a folder/prefix ending in ``/``: ``<source name>.tensors`` or
    ``.safetensors`` inside it). It appears whole or not at all; an existing
    ``dst`` is refused with :class:`~tensorstream.conversion.errors.DestinationExistsError` unless
    ``overwrite=True``. A local destination is on disk (fsync) before it
    appears, unless ``durable=False`` (``cp``'s ``--no-fsync``: it still
    appears whole, but a power loss right after can leave it empty).

    Streamed tensor by tensor, no model built: memory stays at a few tensors
    plus read-ahead (see docs/convert.md), never the whole checkpoint. Bytes
    are copied unchanged; names are the checkpoint's (tensorizer entries are
    written as a state dict, like ``tensorstream.serialize(state_dict)``).

    ``encryption``: as for :func:`tensorstream.serialize` when writing a
    tensorizer file (an :class:`~tensorstream.tensorizer.Encryption`, 32 key
    bytes, tensorizer ``EncryptionParams``; a key file that does not exist yet
    gets a new random key), as for :func:`tensorstream.deserialize` when
    reading an encrypted one. ``metadata``: extra ``__metadata__`` strings for
    a safetensors destination (``{"format": "pt"}`` is always written, as
    ``transformers`` expects); a tensorizer file cannot hold metadata, so a
    safetensors source's is dropped and said in ``result.notes``.
    ``progress(done_bytes, total_bytes)`` is called after each tensor.
    Every tensor of a tensorizer source is checked against the hashes stored
    with it before it is written: a damaged byte raises
    :class:`~tensorstream.tensorizer.TensorHashMismatchError` and nothing is
    published (the hashes do not survive in a safetensors file, so a damage
    converted could never be found again). ``verify_hash=False`` skips the
    check (tensorizer's own default); ``True`` insists on it, and is refused
    for a safetensors source, which holds no hashes.
    ``options`` apply to both sides (as for :func:`tensorstream.open`);
    ``src_options``/``dst_options`` override them for one side.

    Raises :class:`~tensorstream.conversion.errors.UnsupportedDtypeError` for a tensor the
    target format
    cannot hold, before anything is written;
    :class:`~tensorstream.tensorizer.DecryptionError` for a wrong key;
    :class:`~tensorstream.errors.MalformedFileError` for a damaged source.

    >>> tensorstream.convert("s3://b/llama/model.safetensors.index.json",  # doctest: +SKIP
    ...                      "s3://b/llama/model.tensors")
    ConvertResult(src='s3://b/llama/model.safetensors.index.json', ...)
    """
    started = time.perf_counter()
    _check_arguments(overwrite=overwrite, durable=durable, verify_hash=verify_hash,
                     progress=progress, src_options=src_options, dst_options=dst_options)
    sopts = {**options, **(src_options or {})}
    dopts = {**options, **(dst_options or {})}
    src_parsed, dst_parsed = parse_uri(src), parse_uri(dst)
    fmt = source_format(src_parsed, sopts)
    target = TENSORIZER if fmt == SAFETENSORS else SAFETENSORS
    if verify_hash is True and fmt == SAFETENSORS:
        raise ConfigurationError("verify_hash= checks a tensorizer source's stored hashes; a "
                                 "safetensors source has none (tensorizer hashes what it writes)")
    dst_parsed = _destination(src_parsed, dst_parsed, target)
    if _same_object(src_parsed, dst_parsed):
        raise ConfigurationError(f"source and destination are the same: {dst_parsed.redacted()}")
    if metadata is not None:
        if target == TENSORIZER:
            raise ConfigurationError("metadata= is for a safetensors destination; tensorizer "
                                     "files cannot hold metadata")
        if not isinstance(metadata, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ConfigurationError("safetensors metadata must map strings to strings")
        for text in (*metadata, *metadata.values()):
            if not is_utf8(text):  # JSON would escape it, into a file no reader loads
                raise ConfigurationError(f"metadata {text!r:.80} is not valid Unicode (a lone "
                                         "surrogate); safetensors cannot store it")
    if dst_parsed.is_local:
        directory = os.path.dirname(dst_parsed.path) or "."
        if not os.path.isdir(directory):
            raise NotFoundError(f"destination directory does not exist: {directory}")
    _loop.run_sync(_check_writable(dst_parsed, dopts, overwrite))
    result = ConvertResult(src_parsed.redacted(), dst_parsed.redacted(), fmt, target, 0, 0,
                           0.0, encryption is not None)
    if fmt == SAFETENSORS:
        _to_tensorizer(src_parsed, dst_parsed, sopts, dopts, encryption, overwrite, durable,
                       progress, result)
    else:
        _to_safetensors(src_parsed, dst_parsed, sopts, dopts, encryption, metadata, overwrite,
                        durable, progress, result, verify_hash=verify_hash is not False)
    result.seconds = time.perf_counter() - started
    return result


def _check_arguments(*, overwrite: Any, durable: Any, verify_hash: Any, progress: Any,
                     src_options: Any, dst_options: Any) -> None:
    """Refuse arguments of the wrong kind before anything is read: ``overwrite="no"`` is
    truthy, and would replace the destination."""
    for name, flag in (("overwrite", overwrite), ("durable", durable),
                       ("verify_hash", verify_hash)):
        if not isinstance(flag, bool) and not (name == "verify_hash" and flag is None):
            raise ConfigurationError(f"{name}= takes True or False, not {flag!r:.40}")
    if progress is not None and not callable(progress):
        raise ConfigurationError(
            "progress= takes a function called with (done_bytes, total_bytes), not "
            f"{type(progress).__name__}")
    for name, given in (("src_options", src_options), ("dst_options", dst_options)):
        if given is not None and not isinstance(given, Mapping):
            raise ConfigurationError(
                f"{name}= takes a mapping of options (as tensorstream.open takes), not "
                f"{type(given).__name__}")


class _Progress:
    def __init__(self, total: int, callback: Callable[[int, int], None] | None) -> None:
        self.total, self.done, self.callback = total, 0, callback
        if callback is not None:
            callback(0, total)

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        if self.callback is not None:
            self.callback(self.done, self.total)


def _to_tensorizer(src: ParsedURI, dst: ParsedURI, sopts: dict[str, Any], dopts: dict[str, Any],
                   encryption: Any, overwrite: bool, durable: bool,
                   progress: Callable[[int, int], None] | None, result: ConvertResult) -> None:
    from ..safetensors.sources import resolve
    from ..tensorizer.crypto import as_encryption
    from .to_tensorizer import plan_shards, write_tensorizer

    shards = plan_shards(resolve(src, sopts), sopts, encryption is not None, src.redacted())
    total = sum(t.nbytes for s in shards for t in s.tensors)
    params = as_encryption(encryption, dopts, dst)
    result.tensors = write_tensorizer(shards, sopts, dst, dopts, params, overwrite, durable,
                                      _Progress(total, progress))
    result.bytes = total
    # {"format": "pt"} comes back when converting back to safetensors: not worth a note
    keys = sorted({k for s in shards for k, v in (s.metadata or {}).items()
                   if (k, v) != ("format", "pt")})
    if keys:
        result.notes.append(
            f"safetensors metadata ({', '.join(shown(k) for k in keys)}) was not kept: "
            "tensorizer files "
            "cannot hold metadata")


def _to_safetensors(src: ParsedURI, dst: ParsedURI, sopts: dict[str, Any], dopts: dict[str, Any],
                    encryption: Any, metadata: Mapping[str, str] | None, overwrite: bool,
                    durable: bool, progress: Callable[[int, int], None] | None,
                    result: ConvertResult, *, verify_hash: bool = False) -> None:
    from ..tensorizer.load import deserialize
    from .to_safetensors import plan, write_safetensors

    where = src.redacted()
    # One reader, tensors loaded a batch at a time (lazy_load): memory stays bounded.
    with deserialize(src, "cpu", lazy_load=True, num_readers=1, encryption=encryption,
                     verify_hash=verify_hash, **sopts) as deserializer:
        planned = plan(deserializer, where)
        total = sum(p.nbytes for p in planned)
        write_safetensors(deserializer, planned, where, dst, dopts,
                          {"format": "pt", **(metadata or {})}, overwrite, durable,
                          _Progress(total, progress))
    result.tensors, result.bytes = len(planned), total

