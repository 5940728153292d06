"""Serialize a module or a state dict as a tensorizer file to any writable backend,
atomically (:func:`serialize`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import struct
import tempfile
from collections.abc import Mapping
from typing import Any

import torch
from tensorizer import EncryptionParams, TensorSerializer

from .. import _loop
from .._umask import new_file_mode
from ..api import get_provider
from ..api import open as ts_open
from ..config import _flag
from ..errors import ConfigurationError, NotFoundError, TensorstreamError
from ..providers.local.provider import (
    fsync_path,
    naming_write_errors,
    temp_copy_hint,
    temp_path_for,
)
from ..providers.local.writer import check_destination as check_local_destination
from ..uri import ParsedURI, check_file_destination, parse_uri
from .arguments import InvalidArgumentError, check_cpu_limit, refuse_misspelt_arguments
from .crypto import as_encryption, current_key
from .sharding import is_sharded, shard_uri, warn_stale_shards

__all__ = ["serialize"]

_COPY_CHUNK = 16 << 20


def _has_tensor(obj: Any) -> bool:
    """Whether ``obj`` (a module or a nested state dict) holds at least one tensor."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, torch.nn.Module):
        return any(True for _ in itertools.chain(obj.parameters(), obj.buffers()))
    if isinstance(obj, Mapping):
        return any(_has_tensor(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_has_tensor(v) for v in obj)
    return False


def _not_dense(obj: Any, name: str = "") -> str | None:
    """The name of the first tensor in ``obj`` that is not dense (sparse, mkldnn), or None."""
    if isinstance(obj, torch.Tensor):
        return name if obj.layout != torch.strided else None
    if isinstance(obj, torch.nn.Module):
        named = itertools.chain(obj.named_parameters(), obj.named_buffers())
        return next((n for n, t in named if t.layout != torch.strided), None)
    items = (obj.items() if isinstance(obj, Mapping)
             else enumerate(obj) if isinstance(obj, list | tuple) else ())
    for key, value in items:
        found = _not_dense(value, f"{name}.{key}" if name else str(key))
        if found is not None:
            return found
    return None


#: tensorizer stores a tensor's name with a 2-byte length.
_MAX_NAME = 0xFFFF


def _check_serializable(obj: Any) -> None:
    """Refuse, before anything is written, what would make no readable file."""
    if not isinstance(obj, torch.nn.Module | Mapping | list | tuple):
        raise InvalidArgumentError(
            f"serialize() takes an nn.Module or a (nested) state dict, not {type(obj).__name__}")
    if not _has_tensor(obj):
        raise InvalidArgumentError(
            f"serialize() was given a {type(obj).__name__} without any tensor: tensorizer "
            "cannot read a file without tensors, so none is written")
    for key, value in obj.items() if isinstance(obj, Mapping) else ():
        # tensorizer wrote a tensor named "" into a file its reader refuses ("Invalid empty
        # tensor path"), and a name over its 2-byte length field was a bare struct.error.
        if key == "" and isinstance(value, torch.Tensor):
            raise InvalidArgumentError(
                "serialize(): a tensor named '' (an empty name) makes a file tensorizer "
                "cannot read back: give it a name")
        size = len(key.encode("utf-8", "surrogatepass")) if isinstance(key, str) else 0
        if size > _MAX_NAME:
            raise InvalidArgumentError(
                f"serialize(): tensor name {key[:40]!r}... is {size} bytes in UTF-8; "
                f"tensorizer holds names of at most {_MAX_NAME} bytes")
    # tensorizer's own error is torch's "unsupported memory format option Contiguous".
    if (sparse := _not_dense(obj)) is not None:
        raise InvalidArgumentError(
            f"serialize(): tensor {sparse!r} is not dense (sparse?); tensorizer writes dense "
            "tensors only: convert it with .to_dense() first")


def _write_tensors(obj: Any, path: str, encryption: Any, non_persistent: bool = True,
                   cpu_limit: int | None = None) -> None:
    with open(path, "wb+") as f:
        serializer = TensorSerializer(f, encryption=encryption, limit_cpu_concurrency=cpu_limit)
        try:
            if isinstance(obj, torch.nn.Module):
                serializer.write_module(obj, include_non_persistent_buffers=non_persistent)
            else:
                serializer.write_state_dict(obj)
        except (TypeError, ValueError, IndexError, struct.error) as exc:
            # A value or key tensorizer cannot write ({"b": 5}, {1: t}), or a tensor it cannot
            # write with these settings (an empty one, encrypted): ours to name.
            with contextlib.suppress(Exception):
                serializer.close()
            if isinstance(exc, TensorstreamError):
                raise
            detail = str(exc) if isinstance(exc, TypeError) else f"{type(exc).__name__}: {exc}"
            raise InvalidArgumentError(
                f"serialize(): tensorizer cannot write this ({detail})") from exc
        except BaseException:
            with contextlib.suppress(Exception):
                serializer.close()
            raise
        serializer.close()


#: How often a key file that changed while the tensors were written is taken again.
_KEY_TRIES = 3


def _write_keyed(obj: Any, path: str, params: Any, encryption: Any,
                 options: Mapping[str, Any], model: ParsedURI, non_persistent: bool,
                 cpu_limit: int | None) -> None:
    """:func:`_write_tensors`; encrypted with a key file, the key file is read again once
    the tensors are written, and while it holds another key they are written again with
    that one. Ranks serializing at once with a key file that did not exist each created
    it with a key of their own: the last one written stayed, and every other rank's file
    was encrypted with a key nobody has (published, unreadable)."""
    for _ in range(_KEY_TRIES):
        _write_tensors(obj, path, params, non_persistent, cpu_limit)
        now = current_key(encryption, options, model)
        if now is None or now == params.key:
            return
        params = EncryptionParams(now)
    raise ConfigurationError(
        f"the key file held another key each of the {_KEY_TRIES} times the tensors were "
        "written with it; nothing was published (is something rewriting it?)")


def _check_options(parsed: ParsedURI, options: Mapping[str, Any]) -> None:
    provider = get_provider(parsed, **options)  # validates option names
    _loop.run_sync(provider.close())


def serialize(
    obj: torch.nn.Module | Mapping[str, Any],
    uri: str | os.PathLike[str] | ParsedURI,
    *,
    encryption: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    include_non_persistent_buffers: bool = True,
    limit_cpu_concurrency: int | None = None,
    **options: Any,
) -> str:
    """Write ``obj`` (an ``nn.Module`` or a nested state dict) as a tensorizer file.

    Works for every writable backend and is atomic at the destination. A local
    destination is written to a temporary file beside it and renamed; a remote
    one is written to a local temporary file (tensorizer needs to seek) and
    then streamed up with ``tensorstream.open(uri, "wb")``. Temporary files
    are removed on success and failure. ``encryption`` is an
    :class:`Encryption` (a key file that does not exist yet gets a new random
    key), 32 key bytes or tensorizer ``EncryptionParams``. Returns the URI
    written (rank template filled in). ``include_non_persistent_buffers``: as
    tensorizer's ``write_module`` (a module's ``persistent=False`` buffers are
    written unless it is False; a state dict holds none). ``limit_cpu_concurrency``:
    as ``TensorSerializer``'s (at most that many threads write; default: one per CPU).

    >>> serialize(model, "s3://bucket/model-rank-%03d.tensors", rank=0)  # doctest: +SKIP
    's3://bucket/model-rank-000.tensors'
    """
    refuse_misspelt_arguments(options, serialize)
    raw = os.fspath(uri) if isinstance(uri, os.PathLike) else uri
    target = shard_uri(raw, rank=rank, world_size=world_size) if isinstance(raw, str) else raw
    parsed = parse_uri(target)
    check_file_destination(parsed)
    _check_options(parsed, options)
    non_persistent = _flag("include_non_persistent_buffers", include_non_persistent_buffers)
    if not non_persistent and not isinstance(obj, torch.nn.Module):
        raise ConfigurationError(
            "include_non_persistent_buffers=False leaves out a module's persistent=False "
            f"buffers; serialize() was given a {type(obj).__name__}, which holds none: "
            "leave it out, or pass the module")
    cpu_limit = check_cpu_limit(limit_cpu_concurrency)
    _check_serializable(obj)
    if (not non_persistent and isinstance(obj, torch.nn.Module)
            and not _has_tensor(obj.state_dict())):
        raise InvalidArgumentError(
            "serialize() was given a module whose only tensors are non-persistent buffers, "
            "with include_non_persistent_buffers=False: tensorizer cannot read a file without "
            "tensors, so none is written")
    params = as_encryption(encryption, options, parsed)
    if parsed.is_local:
        directory = os.path.dirname(parsed.path) or "."
        if not os.path.isdir(directory):
            raise NotFoundError(f"destination directory does not exist: {directory}")
        # As the local writer: a directory is refused before anything is written (its
        # rename failed last, a bare IsADirectoryError), a FIFO or device never replaced.
        check_local_destination(parsed.path)
        tmp = temp_path_for(parsed.path)
        try:
            with naming_write_errors(parsed.path):  # (tmp is beside it)
                _write_keyed(obj, tmp, params, encryption, options, parsed, non_persistent,
                             cpu_limit)
            os.chmod(tmp, new_file_mode())  # as every local write: 0666 less the umask
            fsync_path(tmp)
            check_local_destination(parsed.path)  # one may have appeared meanwhile
            os.replace(tmp, parsed.path)
            fsync_path(directory, directory=True)
        except BaseException:
            # (a name never created is not unlinked: on a read-only filesystem that
            # failed too, EROFS, and took the place of the error being raised)
            if os.path.lexists(tmp):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        return _written(raw, target, rank, world_size, options)
    with tempfile.TemporaryDirectory(prefix="tensorstream-serialize-") as tmpdir:
        tmp = os.path.join(tmpdir, "model.tensors")
        # tensorizer seeks in what it writes: the whole file is made here first.
        with naming_write_errors(tmp, temp_copy_hint("serialize()", parsed)):
            _write_keyed(obj, tmp, params, encryption, options, parsed, non_persistent,
                         cpu_limit)
        with open(tmp, "rb") as src, ts_open(parsed, "wb", **options) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)
    return _written(raw, target, rank, world_size, options)


def _written(raw: Any, target: Any, rank: int | None, world_size: int | None,
             options: Mapping[str, Any]) -> str:
    """``target`` as a string, once rank 0 of a rank template has looked for a
    shard left from an earlier save with more ranks (a load would refuse it)."""
    if isinstance(raw, str) and is_sharded(raw):
        warn_stale_shards(raw, rank, world_size, options)
    return str(target)
