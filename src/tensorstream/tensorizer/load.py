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
import dataclasses
import itertools
import os
import shutil
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import torch
from tensorizer import EncryptionParams, TensorDeserializer, TensorSerializer

from .. import _loop
from .._gcpause import paused
from .._umask import new_file_mode
from ..api import get_provider
from ..api import open as ts_open
from ..config import COMMON_OPTIONS, VALIDATORS, _flag, option_hint, validate_options
from ..distributed.exchange import agree, agreed
from ..distributed.group import Group, resolve_group, template_rank
from ..distributed.memory import MemorySource
from ..distributed.tensorizer import fetch as fetch_shared
from ..errors import (
    ConfigurationError,
    InvalidURIError,
    LoadError,
    NotFoundError,
    TensorstreamError,
)
from ..file import StreamReader
from ..providers.local.provider import _check_destination as check_local_destination
from ..providers.local.provider import (
    fsync_path,
    naming_write_errors,
    temp_copy_hint,
    temp_path_for,
)
from ..readahead.localfill import workers
from ..uri import ParsedURI, check_file_destination, parse_uri, redact
from .crypto import (
    Encryption,
    as_decryption,
    as_encryption,
    current_key,
    generate_keyfile,
)
from .foreign import DecryptionError, TensorHashMismatchError, translate
from .hook import (
    StreamTensorDeserializer,
    forks,
    reader_count,
    tensor_entries,
    tensor_names,
)
from .local import LocalTensorDeserializer, fast_path, on_cpu, open_local
from .remote import RemoteTensorDeserializer
from .sharding import check_template, is_sharded, resolve_rank, shard_uri
from .stats import LoadStats, collect
from .stats import log as load_log

__all__ = [
    "DEFAULT_LOCAL_NUM_READERS",
    "DEFAULT_NUM_READERS",
    "DecryptionError",
    "DeviceUnavailableError",
    "Encryption",
    "InvalidArgumentError",
    "LoadError",
    "LoadStats",
    "MetaTensorError",
    "ModuleLoadResult",
    "ModuleMismatchError",
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
#: Local files are plain OS files (``local.open_local``): two readers parallelise
#: page faults and copies on two cores (CUDA loads; CPU loads: ``local.py``).
DEFAULT_LOCAL_NUM_READERS = 2
#: vLLM registers this (meta) parameter on models it serializes.
VLLM_MARKER = "vllm_tensorized_marker"
_COPY_CHUNK = 16 << 20


class MetaTensorError(TensorstreamError, ValueError):
    """Parameters or buffers were left on the ``meta`` device after loading."""


class ModuleMismatchError(MetaTensorError):
    """The module and the file do not hold the same tensors (``strict=True``).

    ``missing_keys`` (in the module, not in the file), ``unexpected_keys`` (in
    the file, not in the module) and ``mismatched_keys`` (``(name,
    module_shape, file_shape)``) list every difference. A subclass of
    :class:`MetaTensorError`, which a module built on ``meta`` would otherwise
    end in.
    """

    def __init__(self, message: str, *, missing_keys: list[str], unexpected_keys: list[str],
                 mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__(message)
        self.missing_keys = missing_keys
        self.unexpected_keys = unexpected_keys
        self.mismatched_keys = mismatched_keys


class DeviceUnavailableError(ConfigurationError, RuntimeError):
    """The requested device does not exist here (``cuda`` without CUDA, a name torch
    does not know). Also a ``RuntimeError``: what tensorizer's ``TensorDeserializer``
    (and ``torch.device``) raise for the same call, and its users catch."""


class InvalidArgumentError(TensorstreamError, TypeError):
    """An argument of the wrong kind (``serialize(42, ...)``, a module that is not
    an ``nn.Module``); the message names the argument and what it takes."""


class _WrongKindOption(InvalidArgumentError, ConfigurationError):
    """A ``deserialize`` argument of the wrong kind (``filter_func=5``, ``dtype=5``):
    the ``TypeError`` tensorizer's ``TensorDeserializer`` raises for it, and the
    ``ConfigurationError`` tensorstream raised before."""


class _WrongKindSource(InvalidArgumentError, InvalidURIError):
    """A source ``deserialize`` does not read (an open file object): the ``TypeError``
    of an argument of the wrong kind, and the ``InvalidURIError`` it raised before."""


class QuantizationWarning(UserWarning):
    """Loading tensorizer weights into a quantized module may not work."""


@dataclasses.dataclass
class ModuleLoadResult:
    """What :func:`load_into_module` did, like ``nn.Module.load_state_dict``'s result.

    ``missing_keys``/``unexpected_keys`` as in torch; ``mismatched_keys``
    holds ``(name, module_shape, file_shape)`` of tensors left alone because
    their shapes differ (all three are empty after a ``strict=True`` load).
    ``loaded`` counts the tensors put into the module; ``stats`` is the
    load's :class:`LoadStats`.
    """

    loaded: int
    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    stats: LoadStats | None = None


def _check_device(device: str | torch.device | None) -> torch.device | None:
    """The device, parsed; a clear error for a name torch does not know or a
    device this machine lacks (before any byte is read)."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DeviceUnavailableError(
            f"device={device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'"
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)")
            raise DeviceUnavailableError(
                f"device={str(device)!r} was requested but CUDA is not available: {why}; "
                "use device='cpu', or install a CUDA build of torch on a machine with a GPU"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceUnavailableError(
                f"device={str(device)!r} was requested but only {count} CUDA device(s) "
                f"are visible (cuda:0..cuda:{count - 1})"
            )
    return dev


def _check_dtype(dtype: Any) -> torch.dtype | None:
    """``dtype`` as a ``torch.dtype``; ``"float16"``/``"torch.float16"`` are accepted."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise (ConfigurationError if isinstance(dtype, str) else _WrongKindOption)(
        f"dtype={dtype!r} is not a torch dtype; use e.g. torch.float16 or 'bfloat16'"
    )


class _LoadRecord:
    """The numbers of one load, turned into :class:`LoadStats` and one INFO line."""

    def __init__(self, where: str, stream: Any, started: float, lazy: bool) -> None:
        self.where = where
        self.stream = stream
        self.started = started
        self.lazy = lazy
        self.ended: float | None = None
        self.logged = False
        size = _size_of(stream)  # now: an eager load closes a plain file
        self.size = size if isinstance(size, int) else None

    def snapshot(self, deserializer: TensorDeserializer) -> LoadStats:
        end = self.ended if self.ended is not None else time.perf_counter()
        return collect(self.where, self.stream, forks(deserializer), seconds=end - self.started,
                       readers=reader_count(deserializer), tensors=len(deserializer),
                       file_size=self.size)

    def loaded(self, deserializer: TensorDeserializer) -> None:
        """The tensors are in memory (eager load): stop the clock, log the line."""
        self.ended = time.perf_counter()
        self._log(deserializer)

    def finish(self, deserializer: TensorDeserializer) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()
        self._log(deserializer)

    def _log(self, deserializer: TensorDeserializer) -> None:
        if self.logged:
            return
        self.logged = True
        try:
            stats = self.snapshot(deserializer)
        except Exception:  # statistics never fail a load
            load_log.debug("no statistics for %s", self.where, exc_info=True)
            return
        load_log.info("%s", stats)
        for i, decision in enumerate(stats.decisions):
            load_log.debug("%s reader %d: %s", self.where, i, decision)


#: Arguments tensorizer's ``TensorDeserializer`` still takes, "left for backwards
#: compatibility; has no effect": calls (and vLLM ``deserialization_kwargs``) written for
#: it pass them, and they are taken here the same way.
_TENSORIZER_NO_OPS = ("plaid_mode", "plaid_mode_buffers")


def _refuse_misspelt_arguments(options: Mapping[str, Any], front: Callable[..., Any]) -> None:
    """A ``ConfigurationError`` for an option that is a near spelling of one of ``front``'s
    own arguments (``lazy_lod``): it reached ``open`` as a storage option, whose error
    listed the storage options and guessed nothing."""
    unknown = set(options) - COMMON_OPTIONS - VALIDATORS.keys()
    if not unknown:
        return
    import inspect

    from ..providers.registry import known_option_names

    own = {n for n, p in inspect.signature(front).parameters.items()
           if p.kind is inspect.Parameter.KEYWORD_ONLY}
    for name in sorted(unknown - known_option_names()):
        hint = option_hint(name, own)
        if hint:
            raise ConfigurationError(
                f"unknown argument {name}{hint} for tensorstream.{front.__name__}; it takes "
                f"{', '.join(sorted(own))} and the options of tensorstream.open")


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
    group: Any = None,
    group_timeout: float | None = None,
    max_tensor_bytes: int | str | None = None,
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
    to :data:`DEFAULT_NUM_READERS`; for a local file loaded onto the CPU it bounds the
    threads that fill the tensors (:mod:`tensorstream.tensorizer.local`). ``options``
    go to :func:`tensorstream.open`.

    Each load logs one INFO line on the ``tensorstream.load`` logger (redacted
    URI, bytes, seconds, GB/s, read path, readers, requests, retries; a lazy
    load when it is closed) and DEBUG lines for the read-path decisions; the
    same numbers are ``result.stats`` (:class:`LoadStats`). A device this
    machine lacks raises :class:`DeviceUnavailableError` before any read;
    torch's and tensorizer's runtime failures are raised as :class:`LoadError`
    naming the file (the original chained).

    ``group``: a ``torch.distributed`` process group, or ``"auto"`` for the
    default group when one is initialised: the ranks read the object once
    between them (each a share, exchanged over the group's collectives) and
    each gets every tensor, verified as in a load of its own; a failure on
    any rank raises :class:`~tensorstream.errors.DistributedLoadError` on
    every rank. ``group_timeout`` (seconds) bounds each collective wait
    (default: the group's timeout). A rank template reads each rank's own
    file (no exchange), filled with the rank in a process group passed as
    ``group`` (vLLM's tensor-parallel rank); a failure on any rank raises on
    every rank there too. ``None`` or a group of one is a load of its own.
    See docs/distributed.md.

    Before allocating, the bytes the tensors to load claim (a *meta* tensor,
    stored without data and loaded as zeros, claims its whole shape) are
    compared with what ``device`` can hold now (CPU: available memory and free
    swap, within the memory cgroup; CUDA: the device's free memory); more
    raises :class:`~tensorstream.errors.InsufficientMemoryError` (a
    ``MemoryError``) naming the file and both figures. ``max_tensor_bytes``
    (bytes, or a size like ``"64GiB"``) replaces that figure with an
    allowance of your own. A lazy load checks each access (of 64 MiB or more,
    unless ``max_tensor_bytes`` is given).

    >>> with deserialize("/models/m.tensors", device="cpu") as sd:  # doctest: +SKIP
    ...     print(sd["lm_head.weight"].shape)
    """
    started = time.perf_counter()
    for name in _TENSORIZER_NO_OPS:
        options.pop(name, None)
    _refuse_misspelt_arguments(options, deserialize)
    checked = validate_options({"num_readers": num_readers, "verify_hash": verify_hash,
                                "lazy_load": lazy_load, "max_tensor_bytes": max_tensor_bytes})
    num_readers, verify_hash, lazy_load = (
        checked["num_readers"], checked["verify_hash"], checked["lazy_load"])
    allowance: int | None = checked["max_tensor_bytes"]
    if filter_func is not None and not callable(filter_func):
        raise _WrongKindOption(
            f"filter_func must be a function of a tensor name returning True to load it, "
            f"not {type(filter_func).__name__}")
    if not isinstance(uri, str | os.PathLike | ParsedURI | StreamReader):
        hint = (": give an open file object to tensorizer's TensorDeserializer itself (it "
                "reads it with one reader), or pass its path or URI here"
                if hasattr(uri, "read") else "")
        raise _WrongKindSource(
            f"deserialize() reads a URI, a path or a reader from tensorstream.open(), not a "
            f"{type(uri).__name__}{hint}")
    stream: StreamReader | BinaryIO | MemorySource | None = None
    shared: Group | None = None
    if isinstance(uri, StreamReader):
        if (rank is not None or world_size is not None or options
                or group not in (None, "auto")):
            raise ConfigurationError(
                "rank/world_size/group/options need a URI, not an open stream")
        stream, target, where = uri, None, uri.name
    else:
        raw = os.fspath(uri) if isinstance(uri, os.PathLike) else uri
        # With group=, an untemplated URI is one file for the whole group (even a
        # group of one: no "every rank reads the same file" error); a templated
        # URI names a file per rank, which each rank reads itself.
        sharded = isinstance(raw, str) and is_sharded(raw)
        # Checked with a template too: group="autp", group=5 or group_timeout=-1 passed
        # without a word there.
        shared = resolve_group(group, group_timeout)
        if sharded and shared is not None:
            check_template(str(raw))  # the same on every rank: its own error, not the group's
            # Each rank loads its own file, filled with its rank in the group passed
            # (vLLM: the tensor-parallel rank; the global rank named shard 2 for rank 0
            # of the group [2, 3]), and the group agrees: a rank whose shard was missing
            # raised alone while the others went on to their next collective and waited.
            def own() -> TensorDeserializer:
                mine, size = template_rank(group, rank, world_size)
                return deserialize(raw, device, num_readers=num_readers,
                                   verify_hash=verify_hash, encryption=encryption,
                                   filter_func=filter_func, dtype=dtype, lazy_load=lazy_load,
                                   rank=mine, world_size=size,
                                   max_tensor_bytes=max_tensor_bytes, **options)

            return agreed(shared, f"loading {redact(str(raw))} (a rank template: one file per "
                          f"rank of the {shared.size}-rank group)", own, _close)
        if sharded:  # a group of one, or none
            rank, world_size = template_rank(group, rank, world_size)
        elif group is not None and (rank is not None or world_size is not None):
            # Not used with group= (the group's ranks share one file), but still checked:
            # rank=3, world_size=2 passed without a word.
            resolve_rank(rank, world_size)
        target = (shard_uri(raw, rank=rank, world_size=world_size)
                  if isinstance(raw, str) and (sharded or group is None) else raw)
        where = redact(str(target))
    early: BaseException | None = None
    try:
        _check_device(device)
        dtype = _check_dtype(dtype)
    except Exception as exc:
        if shared is None:
            raise
        early = exc  # told to the group at its first step: every rank raises
    decryption = None
    if shared is not None and early is None:
        # A key file is read here, on each rank (a missing file, another rank's
        # credentials): raised on this rank alone, it left the others waiting in a
        # collective this rank never joined (or matched with its next load's).
        try:
            decryption = as_decryption(encryption, options, target)
        except Exception as exc:
            mapped = translate(exc, where, keyed=encryption is not None)
            if mapped is not None:
                mapped.__cause__ = exc
            early = mapped or exc
    try:
        if shared is None:
            decryption = as_decryption(encryption, options, target)
        if shared is not None:
            assert target is not None
            stream = fetch_shared(target, shared, options, where, encryption=decryption,
                                  filter_func=filter_func, early=early)
        elif stream is None:
            assert target is not None
            # A whole load reads from byte 0 onward: its open is the stream from
            # byte 0 (no HEAD first). A filtered or lazy one reads a few ranges.
            stream = open_local(target, options) or ts_open(
                target, "rb", sequential=filter_func is None and not lazy_load, **options)
        readers = _default_readers(stream) if num_readers is None else num_readers
        fast = fast_path(stream, device)  # threads fill a local file's tensors (local.py)
        load_log.debug(
            "opened %s (%s bytes): %s, %d reader(s)%s", where, _size_of(stream),
            "plain OS file, tensors filled in chunks by threads (up to)" if fast
            else "plain OS file" if not isinstance(stream, StreamReader | MemorySource)
            else f"read once by a group of {shared.size}" if shared is not None
            else f"{getattr(getattr(stream, '_provider', None), 'service', '?')} provider",
            workers(num_readers or 0, 1 << 62) if fast else readers,
            " (default)" if num_readers is None else "",
        )
        record = _LoadRecord(where, stream, started, lazy_load)
        fetched = (isinstance(stream, StreamReader) and not stream.read_hints.inline
                   and not lazy_load
                   and filter_func is None and decryption is None and shared is None
                   and on_cpu(device))  # threads fetch, tensorizer parses (remote.py)
        with paused():  # (an eager load builds every tensor here)
            deserializer = (LocalTensorDeserializer if fast else RemoteTensorDeserializer
                            if fetched else StreamTensorDeserializer)(
                stream,
                device=device,
                filter_func=filter_func,
                dtype=dtype,
                lazy_load=lazy_load,
                num_readers=num_readers if fast else readers,
                verify_hash=verify_hash,
                encryption=decryption,
                max_tensor_bytes=allowance,
            )
    except BaseException as exc:
        mapped = translate(exc, where, keyed=encryption is not None)
        if shared is not None and isinstance(stream, MemorySource):
            # The exchange first (no other collective may run beside it); then every
            # rank learns that this one failed to build its tensors.
            try:
                stream.join_exchange()
            finally:
                stream.close()
            agree(shared, f"loading {where}", mapped or exc)
        elif stream is not None:
            stream.close()
        if mapped is not None:
            raise mapped from exc
        raise
    if shared is not None:
        try:
            assert isinstance(stream, MemorySource)
            stream.join_exchange()
            agree(shared, f"loading {where}", None)  # every rank built its tensors
        except BaseException:
            deserializer.close()
            raise
        if not lazy_load and isinstance(stream, MemorySource):
            stream.release()  # the tensors are built: the file's bytes are not needed
    deserializer._ts_record = record
    if not lazy_load:
        record.loaded(deserializer)
    return deserializer


def _close(deserializer: TensorDeserializer) -> None:
    with contextlib.suppress(Exception):
        deserializer.close()


def _size_of(stream: Any) -> int | str:
    size = getattr(stream, "size", None)
    if size is None:
        try:
            size = os.fstat(stream.fileno()).st_size
        except (OSError, AttributeError, ValueError):
            return "?"
    return int(size)


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
    *,
    strict: bool = True,
    **kwargs: Any,
) -> ModuleLoadResult:
    """Fill ``module``'s parameters and buffers in place from a tensorizer file.

    Works for files written from a module (``write_module``,
    ``serialize(model)``) and from a state dict (``write_state_dict``,
    ``serialize(model.state_dict())``); names are matched like
    ``nn.Module.load_state_dict`` does. Accepts the keyword arguments of
    :func:`deserialize`. ``device`` defaults to where the module's tensors
    already are (tensorizer's default for a module on ``meta``).

    ``strict=True`` (the default): the file and the module must hold the same
    tensors with the same shapes, else :class:`ModuleMismatchError` lists
    every missing, unexpected and shape-mismatched tensor and the module is
    left untouched. ``strict=False``: the tensors that fit are loaded and the
    rest is returned, like ``load_state_dict(strict=False)``. Returns a
    :class:`ModuleLoadResult` (``missing_keys``, ``unexpected_keys``,
    ``mismatched_keys``, ``loaded``, ``stats``). Warns
    (:class:`QuantizationWarning`) for quantized modules.

    >>> load_into_module(model, "s3://bucket/model.tensors", device="cuda:0")  # doctest: +SKIP
    """
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(
            f"load_into_module() fills an nn.Module, not {type(module).__name__}; for a "
            "mapping of tensors use tensorstream.deserialize()"
        )
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
    # What the module holds: its state dict's names (params and persistent
    # buffers, tied weights under every name), and every tensor slot a file may fill.
    expected = {k: tuple(v.shape) for k, v in module.state_dict(keep_vars=True).items()}
    slots: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    slots.update(module.named_buffers(remove_duplicate=False))
    with deserialize(uri, device, **kwargs) as deserializer:
        # write_module names a top-level module's own tensors ".name" (one dot, dropped);
        # a state dict's names are its keys, kept as they are
        in_file = {name[1:] if kind != "state_dict" and name.startswith(".") else name:
                   (name, shape) for name, kind, shape in tensor_entries(deserializer)
                   if name in deserializer}
        missing = [k for k in expected if k not in in_file and not k.endswith(VLLM_MARKER)]
        unexpected = [k for k in in_file if k not in slots and not k.endswith(VLLM_MARKER)]
        mismatched = [(k, tuple(slots[k].shape), shape) for k, (_, shape) in in_file.items()
                      if k in slots and tuple(slots[k].shape) != shape]
        refused = None
        if strict and (missing or unexpected or mismatched):
            refused = ModuleMismatchError(
                _mismatch_message(where, missing, unexpected, mismatched),
                missing_keys=missing, unexpected_keys=unexpected, mismatched_keys=mismatched,
            )
        shared = _module_group(uri, kwargs)
        if shared is not None:
            # The group's load succeeded, but the modules may differ between ranks: one
            # rank refusing its module while the others go on would leave them waiting at
            # their next collective. Every rank raises, and no module is filled.
            agree(shared, f"loading {where} into the module", refused)
        elif refused is not None:
            raise refused
        bad = {k for k, _, _ in mismatched}
        loaded = 0
        try:
            for key, (name, _) in in_file.items():
                if key in slots and key not in bad:
                    _assign(module, key, deserializer[name])
                    loaded += 1
        except BaseException as exc:
            mapped = translate(exc, where,
                               keyed=getattr(deserializer, "_encryption", None) is not None)
            if mapped is not None:
                raise mapped from exc
            raise
        stats = deserializer.stats
    left = [
        name
        for name, t in (*module.named_parameters(), *module.named_buffers())
        if t.device.type == "meta" and not name.endswith(VLLM_MARKER) and name not in missing
    ]
    if left:  # a file that holds them but did not fill them (should not happen)
        shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
        raise MetaTensorError(
            f"{len(left)} tensor(s) are still on the meta device after loading {where}: "
            f"{shown}. Check that the module matches the serialized model "
            "(architecture, quantization, filter_func)."
        )
    return ModuleLoadResult(loaded, missing, unexpected, mismatched, stats)


def _module_group(uri: Any, kwargs: Mapping[str, Any]) -> Group | None:
    """The group :func:`deserialize` shares this load with (``group=``), or None."""
    if isinstance(uri, StreamReader) or kwargs.get("group") is None:
        return None
    # a rank template too: a rank whose module differs raised alone, its peers went on
    return resolve_group(kwargs["group"], kwargs.get("group_timeout"))


def _mismatch_message(
    where: str, missing: list[str], unexpected: list[str],
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
) -> str:
    def shown(items: list[str]) -> str:
        return ", ".join(items[:20]) + (f" and {len(items) - 20} more" if len(items) > 20 else "")

    parts = []
    if missing:
        parts.append(f"missing from the file ({len(missing)}): {shown(missing)}")
    if unexpected:
        parts.append(f"not in the module ({len(unexpected)}): {shown(unexpected)}")
    if mismatched:
        parts.append(f"shape mismatch ({len(mismatched)}): " + shown(
            [f"{k} module {list(a)} file {list(b)}" for k, a, b in mismatched]))
    return (
        f"{where} does not match the module: {'; '.join(parts)}. Check that the module "
        "matches the serialized model (architecture, config, quantization, filter_func), "
        "or pass strict=False to load the tensors that fit and get the rest back."
    )


def _assign(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Put ``tensor`` in place of the parameter or buffer ``name`` (replacing it,
    as tensorizer does, so a module on ``meta`` gets real storage)."""
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if attr in owner._parameters:
        old = owner._parameters[attr]
        requires_grad = bool(old.requires_grad) if old is not None else False
        data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        owner._parameters[attr] = torch.nn.Parameter(data, requires_grad=requires_grad)
    else:
        owner._buffers[attr] = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor


# -- serialize -------------------------------------------------------------------


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


def _check_cpu_limit(limit: Any) -> int | None:
    """``limit_cpu_concurrency``, checked before anything is written (tensorizer raises
    the same TypeError/ValueError only once the destination is open)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise _WrongKindOption(
            f"limit_cpu_concurrency must be a whole number of threads or None, not "
            f"{type(limit).__name__}")
    if limit < 1:
        raise ConfigurationError(
            f"limit_cpu_concurrency must be at least 1 (or None: one thread per CPU), "
            f"got {limit}")
    return limit


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
    _refuse_misspelt_arguments(options, serialize)
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
    cpu_limit = _check_cpu_limit(limit_cpu_concurrency)
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
        return str(target)
    with tempfile.TemporaryDirectory(prefix="tensorstream-serialize-") as tmpdir:
        tmp = os.path.join(tmpdir, "model.tensors")
        # tensorizer seeks in what it writes: the whole file is made here first.
        with naming_write_errors(tmp, temp_copy_hint("serialize()", parsed)):
            _write_keyed(obj, tmp, params, encryption, options, parsed, non_persistent,
                         cpu_limit)
        with open(tmp, "rb") as src, ts_open(parsed, "wb", **options) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)
    return str(target)


def _default_readers(stream: Any) -> int:
    if not isinstance(stream, StreamReader):  # a local file (see local.open_local)
        return DEFAULT_LOCAL_NUM_READERS
    hints = stream.read_hints
    if hints.inline:
        return DEFAULT_LOCAL_NUM_READERS
    if hints.serial_server:
        return 1
    return DEFAULT_NUM_READERS
