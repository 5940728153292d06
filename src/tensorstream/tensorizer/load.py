"""Load tensorizer files from any backend onto a device, and serialize to any backend.

>>> import tensorstream
>>> with tensorstream.deserialize("s3://bucket/model.tensors", device="cuda") as sd:  # doctest: +SKIP
...     model.load_state_dict(sd)
>>> tensorstream.load_into_module(model, "https://host/model.tensors")  # doctest: +SKIP
>>> tensorstream.serialize(model, "redis://host:6379/model.tensors")  # doctest: +SKIP

Reads go through :func:`tensorstream.open`: each tensor's ``readinto`` fans
out into concurrent ranged requests straight into the tensor's memory, and
``num_readers > 1`` really runs in parallel (see ``_tensorizer_compat``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import torch
from tensorizer import TensorDeserializer, TensorSerializer

from .. import _loop
from ..api import get_provider
from ..api import open as ts_open
from ..errors import ConfigurationError, NotFoundError, TensorstreamError
from ..file import StreamReader
from ..providers.local.provider import map_local_error, temp_path_for
from ..uri import ParsedURI, parse_uri, redact
from .crypto import (
    DecryptionError,
    Encryption,
    TensorHashMismatchError,
    as_decryption,
    as_encryption,
    generate_keyfile,
)
from .hook import (
    CryptographyError,
    HashMismatchError,
    StreamTensorDeserializer,
    tensor_names,
)
from .sharding import is_sharded, shard_uri

__all__ = [
    "DEFAULT_LOCAL_NUM_READERS",
    "DEFAULT_NUM_READERS",
    "DecryptionError",
    "Encryption",
    "MetaTensorError",
    "QuantizationWarning",
    "TensorHashMismatchError",
    "deserialize",
    "generate_keyfile",
    "is_sharded",
    "is_vllm_tensorized",
    "load_into_module",
    "serialize",
    "shard_uri",
]

#: Parallel readers used when ``num_readers`` is None, for remote sources.
#: Each reader's stream keeps ``concurrency`` requests in flight across tensor
#: boundaries (read-ahead); a second reader overlaps tensorizer's per-tensor
#: work (allocation, page faults) with the first one's copies. Measured with
#: the benchmark harness (2 cores, 512 MiB, loopback and 25 MB/s-capped):
#: 2 readers x 64 MiB windows beat 1 x 128 MiB and 4 x 32 MiB on time and RSS.
DEFAULT_NUM_READERS = 2
#: Local files are plain OS files (see ``_open_local``): two readers
#: parallelise page faults and copies on two cores (tensorizer's best too).
DEFAULT_LOCAL_NUM_READERS = 2
#: vLLM registers this (meta) parameter on models it serializes.
VLLM_MARKER = "vllm_tensorized_marker"
_COPY_CHUNK = 16 << 20


class MetaTensorError(TensorstreamError, ValueError):
    """Parameters or buffers were left on the ``meta`` device after loading."""


class QuantizationWarning(UserWarning):
    """Loading tensorizer weights into a quantized module may not work."""


def _translate(exc: BaseException, where: str) -> BaseException | None:
    if isinstance(exc, DecryptionError | TensorHashMismatchError):
        return None
    if isinstance(exc, CryptographyError):
        return DecryptionError(
            f"could not decrypt {where}: wrong key or passphrase, or encryption settings "
            f"that do not match the file ({exc})"
        )
    if isinstance(exc, HashMismatchError):
        return TensorHashMismatchError(f"verify_hash failed for {where}: {exc}")
    return None


def deserialize(
    uri: str | os.PathLike[str] | ParsedURI | StreamReader,
    device: str | torch.device | None = None,
    *,
    num_readers: int | None = None,
    verify_hash: bool = False,
    encryption: Any = None,
    filter_func: Callable[[Any], bool] | None = None,
    dtype: torch.dtype | None = None,
    lazy_load: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **options: Any,
) -> TensorDeserializer:
    """Open a tensorizer file at any URI as a ``tensorizer.TensorDeserializer``.

    The result is a mapping of tensor name -> tensor on ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:N"``; default: tensorizer's, the current CUDA device
    if any) and a context manager; closing it closes the stream.

    ``encryption``: an :class:`Encryption` (``keyfile=`` at any URI,
    ``passphrase=`` or ``key=``), 32 key bytes, or tensorizer
    ``DecryptionParams``. A wrong key raises :class:`DecryptionError`.
    ``verify_hash=True`` raises :class:`TensorHashMismatchError` on corrupt data.
    A URI with a rank template (``model-rank-%03d.tensors``) is formatted
    with ``rank`` (default: ``torch.distributed``'s). ``num_readers`` defaults
    to :data:`DEFAULT_NUM_READERS`. ``options`` go to :func:`tensorstream.open`.

    >>> with deserialize("/models/m.tensors", device="cpu") as sd:  # doctest: +SKIP
    ...     print(sd["lm_head.weight"].shape)
    """
    stream: StreamReader | BinaryIO | None = None
    if isinstance(uri, StreamReader):
        if rank is not None or world_size is not None or options:
            raise ConfigurationError("rank/world_size/options need a URI, not an open stream")
        stream, target, where = uri, None, uri.name
    else:
        raw = os.fspath(uri) if isinstance(uri, os.PathLike) else uri
        target = shard_uri(raw, rank=rank, world_size=world_size) if isinstance(raw, str) else raw
        where = redact(str(target))
    try:
        decryption = as_decryption(encryption, options)
        if stream is None:
            assert target is not None
            stream = _open_local(target, options) or ts_open(target, "rb", **options)
        return StreamTensorDeserializer(
            stream,
            device=device,
            filter_func=filter_func,
            dtype=dtype,
            lazy_load=lazy_load,
            num_readers=_default_readers(stream) if num_readers is None else num_readers,
            verify_hash=verify_hash,
            encryption=decryption,
        )
    except BaseException as exc:
        if stream is not None:
            stream.close()
        mapped = _translate(exc, where)
        if mapped is not None:
            raise mapped from exc
        raise


def is_vllm_tensorized(deserializer: TensorDeserializer) -> bool:
    """True if the file was serialized by vLLM (it carries ``vllm_tensorized_marker``).

    Read from the metadata the deserializer already parsed; no second open.
    """
    return any(
        n == VLLM_MARKER or n.endswith("." + VLLM_MARKER) for n in tensor_names(deserializer)
    )


def _looks_quantized(module: torch.nn.Module) -> bool:
    if getattr(module, "quant_config", None) or getattr(module, "quantization_config", None):
        return True
    if any("quant" in type(m).__name__.lower() for m in module.modules()):
        return True
    low_bit = {torch.int8, torch.uint8, torch.qint8, torch.quint8, torch.qint32}
    low_bit |= {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
    return any(p.dtype in low_bit for p in module.parameters())


def _module_device(module: torch.nn.Module) -> torch.device | None:
    for t in (*module.parameters(), *module.buffers()):
        if t.device.type != "meta":
            return t.device
    return None


def load_into_module(
    module: torch.nn.Module,
    uri: str | os.PathLike[str] | ParsedURI | StreamReader,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> int:
    """Fill ``module``'s parameters and buffers in place from a tensorizer file.

    Accepts the keyword arguments of :func:`deserialize`. ``device`` defaults
    to where the module's tensors already are (tensorizer's default for a
    module on ``meta``). Returns the number of tensors loaded. Raises
    :class:`MetaTensorError` naming every parameter/buffer still on ``meta``
    afterwards; warns (:class:`QuantizationWarning`) for quantized modules.

    >>> load_into_module(model, "s3://bucket/model.tensors", device="cuda:0")  # doctest: +SKIP
    """
    if _looks_quantized(module):
        warnings.warn(
            "loading tensorizer weights into a module that looks quantized; tensorizer "
            "files hold the tensors as saved, so shapes and dtypes must match exactly",
            QuantizationWarning,
            stacklevel=2,
        )
    if device is None:
        device = _module_device(module)
    where = redact(str(uri.name if isinstance(uri, StreamReader) else uri))
    with deserialize(uri, device, **kwargs) as deserializer:
        try:
            count = deserializer.load_into_module(module)
        except BaseException as exc:
            mapped = _translate(exc, where)
            if mapped is not None:
                raise mapped from exc
            raise
    left = [
        name
        for name, t in (*module.named_parameters(), *module.named_buffers())
        if t.device.type == "meta" and not name.endswith(VLLM_MARKER)
    ]
    if left:
        shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
        raise MetaTensorError(
            f"{len(left)} tensor(s) are still on the meta device after loading {where}: "
            f"{shown}. The file does not hold them: check that the module matches the "
            "serialized model (architecture, quantization, filter_func)."
        )
    return int(count)


# -- serialize -------------------------------------------------------------------


def _write_tensors(obj: Any, path: str, encryption: Any) -> None:
    with open(path, "wb+") as f:
        serializer = TensorSerializer(f, encryption=encryption)
        try:
            if isinstance(obj, torch.nn.Module):
                serializer.write_module(obj)
            elif isinstance(obj, Mapping | list | tuple):
                serializer.write_state_dict(obj)
            else:
                raise TypeError(
                    f"serialize() takes an nn.Module or a (nested) state dict, "
                    f"not {type(obj).__name__}"
                )
        except BaseException:
            with contextlib.suppress(Exception):
                serializer.close()
            raise
        serializer.close()


def _fsync(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    written (rank template filled in).

    >>> serialize(model, "s3://bucket/model-rank-%03d.tensors", rank=0)  # doctest: +SKIP
    's3://bucket/model-rank-000.tensors'
    """
    raw = os.fspath(uri) if isinstance(uri, os.PathLike) else uri
    target = shard_uri(raw, rank=rank, world_size=world_size) if isinstance(raw, str) else raw
    parsed = parse_uri(target)
    _check_options(parsed, options)
    params = as_encryption(encryption, options)
    if parsed.is_local:
        directory = os.path.dirname(parsed.path) or "."
        if not os.path.isdir(directory):
            raise NotFoundError(f"destination directory does not exist: {directory}")
        tmp = temp_path_for(parsed.path)
        try:
            _write_tensors(obj, tmp, params)
            os.chmod(tmp, 0o644)
            _fsync(tmp)
            os.replace(tmp, parsed.path)
            _fsync(directory, directory=True)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return str(target)
    with tempfile.TemporaryDirectory(prefix="tensorstream-serialize-") as tmpdir:
        tmp = os.path.join(tmpdir, "model.tensors")
        _write_tensors(obj, tmp, params)
        with open(tmp, "rb") as src, ts_open(parsed, "wb", **options) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)
    return str(target)


def _open_local(target: str | ParsedURI, options: Mapping[str, Any]) -> BinaryIO | None:
    """A plain OS file for a local path given with no options, else None.

    Nothing beats the kernel here: tensorizer reads it with ``readinto``
    straight into each tensor, and its extra readers reopen the *same inode*
    through ``/proc/self/fd`` (a file replaced by rename meanwhile is not
    mixed in). Errors are tensorstream's (``NotFoundError`` ...).
    """
    if options:
        return None
    parsed = target if isinstance(target, ParsedURI) else parse_uri(target)
    if parsed.scheme != "file":
        return None
    try:
        return open(parsed.path, "rb")  # the deserializer closes it
    except OSError as exc:
        mapped = map_local_error(exc, parsed.path)
        if mapped is exc:
            raise
        raise mapped from exc


def _default_readers(stream: Any) -> int:
    if not isinstance(stream, StreamReader):  # a local file (see _open_local)
        return DEFAULT_LOCAL_NUM_READERS
    hints = stream.read_hints
    if hints.inline:
        return DEFAULT_LOCAL_NUM_READERS
    if hints.serial_server:
        return 1
    return DEFAULT_NUM_READERS
