"""Read safetensors files from any backend straight into tensors.

Every read goes through :func:`tensorstream.open` (the one read engine):
the header comes from one bounded ranged read and is validated before
anything is allocated (:mod:`.header`); each tensor is then allocated in its
final memory (pinned host memory when it goes to a GPU) and filled by the
reader's ``readinto`` of its whole span, which the read-ahead engine fans out
into concurrent ranged requests landing straight in the tensor. Read
boundaries at every tensor keep requests from straddling two tensors.

One open file (its header, a tensor's allocation and fill) is
:class:`~.opened_file.SafetensorsFile`; dtypes and casts are in :mod:`.dtypes`,
the checks of ``filter``, ``device``, ``num_readers`` and ``dtype`` in
:mod:`.arguments`, and a load shared by a ``torch.distributed`` group in
:mod:`.group_load`. This module reads the files and is :func:`load`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._gcpause import paused
from ..config import validate_options
from ..distributed.group import resolve_group
from ..errors import MalformedFileError
from ..file import StreamReader
from ..headroom import check_fits
from ..providers.local.provider import PinnedFile
from ..readahead.arena import Arena
from ..uri import ParsedURI, parse_uri
from . import _local
from ._local import fill_local
from .arguments import Filter, _check, _needed, _sources, _wanted
from .dtypes import PACKED, _casts, _finish, byte_view, no_data, torch_dtype, torch_shape
from .group_load import _shared
from .header import TensorInfo, shown
from .opened_file import SafetensorsFile
from .sources import MAX_CONCURRENT_FILES, Source

__all__ = ["DEFAULT_NUM_READERS", "PACKED", "Filter", "load", "torch_dtype", "torch_shape"]

#: Parallel readers per file for :func:`load`: contiguous stretches of the file,
#: each on its own fork of the reader (shared connections and read-ahead budget).
DEFAULT_NUM_READERS = 2
#: Read-ahead memory of one file's readers when the caller sets no ``readahead``: twice
#: the common default, measured on a 25 MB/s-per-connection link with 170 tensors (512 MiB):
#: 2.05 s at 64 MiB, 1.25 s at 128 MiB (many 2-5 MiB tensors keep more requests in flight).
_READAHEAD = 128 << 20

#: Tensors read to be cast that get a mapping of their own (smaller: ``torch.empty``).
_OWN_MAPPING = 1 << 20


def _own_mapping(t: TensorInfo, where: str) -> torch.Tensor:
    """``t``'s memory in an anonymous mapping of its own, unmapped once the tensor is
    freed. Why: a tensor read only to be cast is freed at once, and the general
    allocator kept much of such memory (peak RSS of a cast load of 192 MiB of 4 MiB
    float32 tensors varied 139-203 MiB over its 96 MiB result; 107-111 so)."""
    region = mmap.mmap(-1, t.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # holds the mapping while it lives
    return raw.view(torch_dtype(t.dtype, where)).reshape(torch_shape(t, where))


def _split(tensors: list[TensorInfo], parts: int) -> list[list[TensorInfo]]:
    """Contiguous runs of ``tensors`` with about the same bytes each."""
    total = sum(t.nbytes for t in tensors)
    if parts <= 1 or len(tensors) < 2 or total == 0:
        return [tensors] if tensors else []
    out: list[list[TensorInfo]] = [[]]
    acc, share = 0, total / parts
    for t in tensors:
        if out[-1] and acc >= share * len(out) and len(out) < parts:
            out.append([])
        out[-1].append(t)
        acc += t.nbytes
    return out


def _boundaries(data_start: int, tensors: list[TensorInfo], part: int) -> list[int]:
    """Where the reads start and end, for the read-ahead's request grid: the data's
    start and each tensor's edges, but not between two tensors smaller than ``part``
    (they share requests anyway): a run of them then counts as one stretch, so the
    grid starts at its first byte, not inside the file's header."""
    out = [data_start]
    for i, t in enumerate(tensors):
        prev = tensors[i - 1] if i else None
        if prev is None or prev.end != t.begin or prev.nbytes >= part or t.nbytes >= part:
            if prev is not None:
                out.append(prev.end)
            out.append(t.begin)
    if tensors:
        out.append(tensors[-1].end)
    return out


def _read_file(source: Source, options: dict[str, Any], wanted: Callable[[str], bool],
               device: torch.device, dtype: torch.dtype | None, num_readers: int,
               emit: Callable[[str, torch.Tensor], None], *, early: bool = False,
               ordered: bool = False, fits: bool = False,
               max_tensor_bytes: int | None = None) -> None:
    """Read the wanted tensors of one file and ``emit`` each (in file order with
    ``ordered``: one reader for a remote file; a local file's are always). ``early``: allocate the
    tensors that read-ahead may reach (up to ``readahead`` bytes ahead) and announce them
    (:meth:`StreamReader.expect`), so read-ahead lands straight in them instead of in
    read-ahead buffers. On the CPU: the tensors allocated early take the place of the
    read-ahead buffers (``load`` keeps every tensor anyway; ``iter_tensors`` holds at most
    the read-ahead window of tensors not yet yielded, as its buffers did). ``fits``: first
    refuse (:func:`~tensorstream.headroom.check_fits`) tensors that claim more than the
    device can hold, or than ``max_tensor_bytes`` (``load`` keeps them all)."""
    with SafetensorsFile(source.uri, options, source=source) as f:
        f.max_tensor_bytes = max_tensor_bytes
        tensors = f.select(wanted, source.names)
        if not tensors:  # a file with no tensors, or none wanted: its header was checked
            return
        if device.type == "meta":  # tensors without data: the header says all they hold
            for t in tensors:  # (reading every byte to drop it took as long as a real load)
                emit(t.name, _finish(no_data(t, f.where), device, dtype))
            return
        if fits:
            check_fits(sum(t.nbytes for t in tensors), device, max_tensor_bytes, f.where,
                       count=len(tensors))
        reader = f.reader
        pin = device.type == "cuda"
        if reader.read_hints.inline:  # a local file: no read-ahead, threads fault memory in
            # (iter_tensors: memory as it goes; a cast: each read tensor is freed once cast,
            # where the mapping of them all held the file to the end beside its cast)
            casting = any(_casts(torch_dtype(t.dtype, f.where), dtype) for t in tensors)
            keep_all = not (pin or ordered or casting)
            memory = Arena([t.nbytes for t in tensors] if keep_all else [])
            at = {t.name: i for i, t in enumerate(tensors)}

            def allocate(t: TensorInfo) -> torch.Tensor:
                if casting and not pin and t.nbytes >= _OWN_MAPPING:
                    return _own_mapping(t, f.where)
                if not keep_all:
                    return f.allocate(t, pin=pin)
                # load keeps every tensor: one mapping, on huge pages where free and cheap
                # (readahead.arena), each tensor a storage of its own inside it.
                out = memory.tensors[at[t.name]]
                return out.view(torch_dtype(t.dtype, f.where)).reshape(torch_shape(t, f.where))

            with _pinned(source, options, reader) as pinned:
                fill_local(reader, tensors,
                           _local.workers(num_readers, sum(t.nbytes for t in tensors)),
                           allocate, byte_view,
                           lambda t, out: emit(t.name, _finish(out, device, dtype)),
                           upfront=keep_all, before_read=memory.populate,
                           read_at=pinned.read_at if pinned is not None else None)
            return
        if ordered:
            num_readers = 1
        elif num_readers == 0:  # the default: one reader where one server thread answers all
            num_readers = 1 if reader.read_hints.serial_server else DEFAULT_NUM_READERS
        runs = _split(tensors, num_readers)
        # (each reader's stretch starts a request: none is shared by two readers)
        reader.set_read_boundaries([*_boundaries(f.header.data_start, tensors, reader.part_size),
                                    *(part[0].begin for part in runs)])

        def run(part: list[TensorInfo], r: StreamReader) -> None:
            # Read-ahead plans ``readahead`` bytes past a read, in requests of up to
            # ``part_size`` bytes: announce that far, so its last request lands in tensors too.
            window = r.readahead + r.part_size if early else 0
            ahead: collections.deque[torch.Tensor] = collections.deque()
            nxt = ahead_bytes = 0
            for i, t in enumerate(part):
                # this tensor, and the ones read-ahead may reach after it
                while nxt < len(part) and (nxt <= i or ahead_bytes - t.nbytes < window):
                    u = part[nxt]
                    out = f.allocate(u, pin=pin)
                    if window and u.nbytes:
                        r.expect(u.begin, byte_view(out))
                    ahead.append(out)
                    ahead_bytes += u.nbytes
                    nxt += 1
                out = ahead.popleft()
                ahead_bytes -= t.nbytes
                emit(t.name, _finish(f.fill(t, r, out), device, dtype))

        # Every stretch on its own fork of the reader, told where the stretch ends:
        # read-ahead stops there, not past the last wanted tensor. (Measured on the
        # 25 MB/s-per-connection link: the opened reader itself, with no end, stayed at
        # 5-11 connections where its fork went to 32; 4.9 s -> 2.5 s for 512 MiB.)
        forks = [reader.fork(end=part[-1].end) for part in runs]
        try:
            if len(runs) == 1:
                run(runs[0], forks[0])
                return
            with concurrent.futures.ThreadPoolExecutor(len(forks) - 1) as pool:
                futures = [pool.submit(run, part, r)
                           for part, r in zip(runs[1:], forks[1:], strict=True)]
                run(runs[0], forks[0])
                for fut in futures:
                    fut.result()
        finally:
            for r in forks:
                r.close()


#: Options that change nothing about how a local file is read.
_PLAIN_OPTIONS = frozenset({"readahead"})


@contextlib.contextmanager
def _pinned(source: Source, options: dict[str, Any], reader: StreamReader
            ) -> Iterator[PinnedFile | None]:
    """The version ``reader`` opened of a plain local file (no options beyond
    :data:`_PLAIN_OPTIONS`), held open for gathered reads; None otherwise
    (options such as ``timeouts`` or test faults keep every read in the reader's
    layers). Why: one read through the layers per tensor cost more than the
    copy for thousands of small tensors (docs/benchmarks.md, "Session 25")."""
    parsed = parse_uri(source.uri)
    if parsed.scheme != "file" or not set(options) <= _PLAIN_OPTIONS or reader.etag is None:
        yield None
        return
    with PinnedFile(parsed.path, reader.etag) as pinned:
        yield pinned


def load(
    uri: str | os.PathLike[str] | ParsedURI,
    device: str | torch.device | int = "cpu",
    *,
    dtype: torch.dtype | None = None,
    filter: Filter = None,
    num_readers: int | None = None,
    group: Any = None,
    group_timeout: float | None = None,
    max_tensor_bytes: int | str | None = None,
    **options: Any,
) -> dict[str, torch.Tensor]:
    """Load a safetensors file, or every shard of a checkpoint, into a dict of tensors.

    ``uri``: a ``.safetensors`` object on any backend, a
    ``model.safetensors.index.json`` (its shards are read concurrently, each
    tensor from the shard the index names) or a folder/prefix ending in ``/``
    holding one. ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or an index N: each tensor
    lands in pinned host memory and is copied once to the device while the
    next one is read. ``dtype``: a floating-point ``torch.dtype`` to cast
    floating-point tensors to (others keep theirs). ``filter``: a predicate on
    names, or a collection of names to load (not one string); the other tensors
    are not read. ``num_readers``: parallel
    readers per file (default :data:`DEFAULT_NUM_READERS`; 1 for Redis, whose
    one server thread answers every request; for a local file, threads
    filling it chunk by chunk, default up to 4 and at most one per CPU this
    process may use). ``options``: as
    for :func:`tensorstream.open` (credentials, endpoints, retries...).

    Byte-identical to ``safetensors.torch.load_file``. A truncated or malformed
    file raises :class:`~tensorstream.errors.MalformedFileError` naming it.

    ``group``: a ``torch.distributed`` process group, or ``"auto"`` for the
    default group when one is initialised: the ranks read the files once
    between them (each a share of every file, exchanged over the group's
    collectives) and each gets every tensor; a failure on any rank raises
    :class:`~tensorstream.errors.DistributedLoadError` on every rank.
    ``group_timeout`` (seconds) bounds each collective wait. ``None`` or a
    group of one is a load of its own. See docs/distributed.md.

    Before allocating a file's tensors, the bytes they take are compared with what
    ``device`` can hold now (CPU: available memory and free swap, within the
    memory cgroup; CUDA: the device's free memory); more raises
    :class:`~tensorstream.errors.InsufficientMemoryError` (a ``MemoryError``)
    naming the file, instead of an out-of-memory kill. ``max_tensor_bytes``
    (bytes, or a size like ``"64GiB"``): an allowance of your own per file instead.

    >>> sd = tensorstream.safetensors.load("s3://bucket/llama/", device="cuda")  # doctest: +SKIP
    """
    allowance: int | None = validate_options(
        {"max_tensor_bytes": max_tensor_bytes})["max_tensor_bytes"]
    shared = resolve_group(group, group_timeout)
    if shared is not None:
        return dict(_shared(uri, device, dtype, filter, num_readers, shared, options,
                            allowance))
    dev, readers = _check(device, num_readers, dtype)
    options = {"readahead": _READAHEAD, **options}
    wanted = _wanted(filter)
    sources = _needed(_sources(uri, options, wanted), wanted)
    out: dict[str, torch.Tensor] = {}
    held_by: dict[str, str] = {}  # tensor name -> the (redacted) file it came from
    lock = threading.Lock()

    def emitter(source: Source) -> Callable[[str, torch.Tensor], None]:
        def emit(name: str, t: torch.Tensor) -> None:
            with lock:
                if name in out:
                    raise MalformedFileError(f"tensor {shown(name)} is in more than one file: "
                                             f"{held_by[name]} and {source.where}")
                out[name] = t
                held_by[name] = source.where
        return emit

    # On the CPU every tensor lives to the end: allocating the next ones early lets
    # read-ahead land in them (no read-ahead buffers). Pinned staging for a GPU is not.
    early = dev.type == "cpu"
    with paused():
        if len(sources) <= 1:
            for source in sources:
                _read_file(source, options, wanted, dev, dtype, readers, emitter(source),
                           early=early, fits=True, max_tensor_bytes=allowance)
        else:
            with concurrent.futures.ThreadPoolExecutor(min(MAX_CONCURRENT_FILES,
                                                           len(sources))) as pool:
                futures = [pool.submit(_read_file, s, options, wanted, dev, dtype, readers,
                                       emitter(s), early=early, fits=True,
                                       max_tensor_bytes=allowance)
                           for s in sources]
                try:
                    for fut in futures:
                        fut.result()
                except BaseException:
                    for fut in futures:
                        fut.cancel()
                    raise
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out
