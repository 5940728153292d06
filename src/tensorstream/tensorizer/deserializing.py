"""Open a tensorizer file at any URI as a ``tensorizer.TensorDeserializer``
(:func:`deserialize`, re-exported by :mod:`tensorstream.tensorizer.load`): a local file
filled by threads, a remote one fetched by threads or streamed through
:func:`tensorstream.open`, one file read once by a ``torch.distributed`` group, or a
rank template's own file per rank; its arguments checked before any read and its
failures raised as tensorstream errors naming the file."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import torch
from tensorizer import TensorDeserializer

from .._gcpause import paused
from ..api import open as ts_open
from ..config import validate_options
from ..distributed.exchange import agree, agreed, gather_ints
from ..distributed.group import Group, resolve_group, template_rank
from ..distributed.memory import MemorySource
from ..distributed.tensorizer import fetch as fetch_shared
from ..errors import ConfigurationError, MalformedFileError
from ..file import StreamReader
from ..readahead.localfill import workers
from ..uri import ParsedURI, redact
from .arguments import (
    TENSORIZER_NO_OPS,
    WrongKindOption,
    WrongKindSource,
    check_device,
    check_dtype,
    refuse_misspelt_arguments,
)
from .claims import check_claims
from .crypto import as_decryption
from .foreign import translate
from .hook import (
    StreamTensorDeserializer,
)
from .load_record import LoadRecord, size_of
from .local import LocalTensorDeserializer, fast_path, on_cpu, open_local
from .remote import RemoteTensorDeserializer
from .sharding import (
    check_template,
    is_sharded,
    missing_shard,
    not_a_template,
    refuse_other_templates,
    refuse_unloaded_shards,
    resolve_rank,
    shard_uri,
    template_print,
    warn_unloaded_in_group,
)
from .stats import log as load_log

__all__ = ["DEFAULT_LOCAL_NUM_READERS", "DEFAULT_NUM_READERS", "deserialize"]

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


def deserialize(
    uri: str | os.PathLike[str] | ParsedURI | StreamReader,
    device: str | torch.device | int | None = None,
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
    for name in TENSORIZER_NO_OPS:
        options.pop(name, None)
    if "sequential" in options:  # was a bare TypeError: "got multiple values for keyword"
        raise ConfigurationError(
            "sequential is an argument of tensorstream.open, not of deserialize, which "
            "chooses its reads itself (one stream for a whole load; ranges with lazy_load "
            "or filter_func): leave it out")
    refuse_misspelt_arguments(options, deserialize)
    checked = validate_options({"num_readers": num_readers, "verify_hash": verify_hash,
                                "lazy_load": lazy_load, "max_tensor_bytes": max_tensor_bytes})
    num_readers, verify_hash, lazy_load = (
        checked["num_readers"], checked["verify_hash"], checked["lazy_load"])
    allowance: int | None = checked["max_tensor_bytes"]
    if filter_func is not None and not callable(filter_func):
        raise WrongKindOption(
            f"filter_func must be a function of a tensor name returning True to load it, "
            f"not {type(filter_func).__name__}")
    if not isinstance(uri, str | os.PathLike | ParsedURI | StreamReader):
        hint = (": give an open file object to tensorizer's TensorDeserializer itself (it "
                "reads it with one reader), or pass its path or URI here"
                if hasattr(uri, "read") else "")
        raise WrongKindSource(
            f"deserialize() reads a URI, a path or a reader from tensorstream.open(), not a "
            f"{type(uri).__name__}{hint}")
    stream: StreamReader | BinaryIO | MemorySource | None = None
    shared: Group | None = None
    templated = False  # a rank template filled with this rank (its own shard's load)
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
            filled: list[tuple[int, int]] = []

            def own() -> TensorDeserializer:
                mine, size = template_rank(group, rank, world_size)
                filled.append(resolve_rank(mine, size))  # the shard it loads, of how many
                return deserialize(raw, device, num_readers=num_readers,
                                   verify_hash=verify_hash, encryption=encryption,
                                   filter_func=filter_func, dtype=dtype, lazy_load=lazy_load,
                                   rank=mine, world_size=size,
                                   max_tensor_bytes=max_tensor_bytes, **options)

            what = (f"loading {redact(str(raw))} (a rank template: one file per rank of the "
                    f"{shared.size}-rank group)")
            loaded = agreed(shared, what, own, _close)
            try:  # every rank loaded its file: which ones, of which template, between them?
                gathered = gather_ints(shared, what, (*filled[0], template_print(str(raw))))
                refuse_other_templates(str(raw), shared.rank, [g[2] for g in gathered])
                warn_unloaded_in_group(str(raw), [(g[0], g[1]) for g in gathered])
            except BaseException:
                _close(loaded)
                raise
            return loaded
        if sharded:  # a group of one, or none
            rank, world_size = template_rank(group, rank, world_size)
        elif group is not None and (rank is not None or world_size is not None):
            # Not used with group= (the group's ranks share one file), but still checked:
            # rank=3, world_size=2 passed without a word.
            resolve_rank(rank, world_size)
        target = (shard_uri(raw, rank=rank, world_size=world_size)
                  if isinstance(raw, str) and (sharded or group is None) else raw)
        if sharded:
            templated = True
            # after shard_uri: its checks of rank= and world_size= come first
            refuse_unloaded_shards(str(raw), rank, world_size, options)
        where = redact(str(target))
    early: BaseException | None = None
    parsed: torch.device | None = None
    try:
        parsed = check_device(device)
        dtype = check_dtype(dtype)
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
            # an eager load's tensors are compared with the memory (or max_tensor_bytes)
            # before any byte is read: after the exchange, every rank had pulled its share
            # and exchanged them all for the deserializer's same refusal
            claims = (None if lazy_load or parsed is None else
                      lambda entries: _held_beside(check_claims(entries, parsed, allowance, where),
                                                   parsed, allowance))
            stream = fetch_shared(target, shared, options, where, encryption=decryption,
                                  filter_func=filter_func, early=early, claims=claims)
        elif stream is None:
            assert target is not None
            # A whole load reads from byte 0 onward: its open is the stream from
            # byte 0 (no HEAD first). A filtered or lazy one reads a few ranges.
            try:
                stream = open_local(target, options) or ts_open(
                    target, "rb", sequential=filter_func is None and not lazy_load, **options)
            except FileNotFoundError as exc:
                if not templated:  # "m-%d.tensors": a name read as it is, and why
                    hint = not_a_template(raw, exc) if isinstance(raw, str) else None
                    if hint is None:
                        raise
                    raise hint from exc
                # "no such file: .../m-002.tensors" said neither that it was rank 2's
                # shard of a template nor what to do (fewer shards than ranks?)
                raise missing_shard(str(raw), rank, world_size, options, exc) from exc
        readers = _default_readers(stream) if num_readers is None else num_readers
        fast = fast_path(stream, device)  # threads fill a local file's tensors (local.py)
        load_log.debug(
            "opened %s (%s bytes): %s, %d reader(s)%s", where, size_of(stream),
            "plain OS file, tensors filled in chunks by threads (up to)" if fast
            else "plain OS file" if not isinstance(stream, StreamReader | MemorySource)
            else f"read once by a group of {shared.size}" if shared is not None
            else f"{getattr(getattr(stream, '_provider', None), 'service', '?')} provider",
            workers(num_readers or 0, 1 << 62) if fast else readers,
            " (default)" if num_readers is None else "",
        )
        record = LoadRecord(where, stream, started, lazy_load)
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
        if target is not None:
            _name_the_other_format(mapped or exc, target, options)
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


def _held_beside(claimed: int, device: Any, allowance: int | None) -> int:
    """The bytes a group load's tensors hold in this process's memory beside the group's
    buffer of the file (both held at once: checked as one sum). Tensors on a GPU are not
    there; ``max_tensor_bytes=`` given vouches for them (as it does without group=)."""
    return claimed if getattr(device, "type", None) == "cpu" and allowance is None else 0


def _close(deserializer: TensorDeserializer) -> None:
    with contextlib.suppress(Exception):
        deserializer.close()


def _default_readers(stream: Any) -> int:
    if not isinstance(stream, StreamReader):  # a local file (see local.open_local)
        return DEFAULT_LOCAL_NUM_READERS
    hints = stream.read_hints
    if hints.inline:
        return DEFAULT_LOCAL_NUM_READERS
    if hints.serial_server:
        return 1
    return DEFAULT_NUM_READERS


def _name_the_other_format(exc: BaseException, target: Any, options: dict[str, Any]) -> None:
    """Add to tensorizer's "Not a tensorizer file" what the file is when it is safetensors
    (an 8-byte header length, then ``{``) or a safetensors index (JSON): handing one to
    ``deserialize`` is a new user's first mistake, and the error did not say what to call
    instead. One read of the first 9 bytes, on this error's path only (the load's own
    stream may be closed by now); nothing is added when that read fails."""
    if not isinstance(exc, MalformedFileError) or "Not a tensorizer file" not in exc.message:
        return
    try:
        with ts_open(target, "rb", **options) as f:
            first = f.read(9)
    except Exception:  # (the load's error is the one raised)
        return
    if first[8:9] == b"{":
        what = "a safetensors file"
    elif first.lstrip()[:1] == b"{":
        what = "JSON (a safetensors index?)"
    else:
        return
    exc.message += (f"; it is {what}: load it with tensorstream.safetensors.load(uri), or "
                    "convert it to tensorizer with tensorstream convert SRC DST.tensors")
    exc.args = (exc.message,)
