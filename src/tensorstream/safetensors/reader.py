"""Read safetensors files from any backend straight into tensors.

Every read goes through :func:`tensorstream.open` (the one read engine):
the header comes from one bounded ranged read and is validated before
anything is allocated (:mod:`.header`); each tensor is then allocated in its
final memory (pinned host memory when it goes to a GPU) and filled by the
reader's ``readinto`` of its whole span, which the read-ahead engine fans out
into concurrent ranged requests landing straight in the tensor. Read
boundaries at every tensor keep requests from straddling two tensors.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import mmap
import os
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch

from .._gcpause import paused
from ..api import open as ts_open
from ..config import validate_options
from ..distributed.exchange import agree, broadcast_shares, is_local, read_share
from ..distributed.group import Group, resolve_group
from ..distributed.plan import Piece, fingerprint, split
from ..errors import ConfigurationError, MalformedFileError
from ..file import StreamReader
from ..headroom import SMALL_CLAIM, check_fits
from ..providers.local.provider import PinnedFile
from ..readahead.arena import Arena
from ..uri import ParsedURI, parse_uri, redact
from . import _local
from ._local import fill_local
from .header import Header, TensorInfo, header_from_prefix, shown
from .sources import Source, resolve

__all__ = ["DEFAULT_NUM_READERS", "PACKED", "Filter", "load", "torch_dtype", "torch_shape"]

#: Parallel readers per file for :func:`load`: contiguous stretches of the file,
#: each on its own fork of the reader (shared connections and read-ahead budget).
DEFAULT_NUM_READERS = 2
#: Shards of a checkpoint read at the same time.
MAX_CONCURRENT_FILES = 4
#: The first read: the length and, almost always, the whole header.
_FIRST_READ = 1 << 20
#: The first read of a group load's header (each rank reads it: kept small).
_EXACT_FIRST_READ = 64 << 10
#: Read-ahead memory of one file's readers when the caller sets no ``readahead``: twice
#: the common default, measured on a 25 MB/s-per-connection link with 170 tensors (512 MiB):
#: 2.05 s at 64 MiB, 1.25 s at 128 MiB (many 2-5 MiB tensors keep more requests in flight).
_READAHEAD = 128 << 20

Filter = Callable[[str], bool] | Collection[str] | None

_DTYPES: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}

#: Dtypes torch holds several elements to one of its own (as safetensors maps them):
#: F4 in pairs, ``float4_e2m1fn_x2``, whose last dimension is half the file's.
PACKED: dict[str, int] = {"F4": 2}


def torch_dtype(name: str, where: str = "") -> torch.dtype:
    """The torch dtype of a safetensors dtype name; a clear error if this torch lacks it."""
    attr = _DTYPES.get(name)
    dtype = getattr(torch, attr, None) if attr else None
    if not isinstance(dtype, torch.dtype):
        raise MalformedFileError(f"{where}: dtype {name} is not supported by torch "
                                 f"{torch.__version__}")
    return dtype


def torch_shape(t: TensorInfo, where: str = "") -> tuple[int, ...]:
    """The shape of ``t`` in torch: the file's, less a packed dtype's pairing (an F4
    ``[4096, 2048]`` is a ``float4_e2m1fn_x2`` ``[4096, 1024]``, as safetensors loads it)."""
    per = PACKED.get(t.dtype)
    if per is None:
        return t.shape
    if not t.shape or t.shape[-1] % per:
        raise MalformedFileError(
            f"{where}: tensor {shown(t.name)} is {t.dtype} of shape {list(t.shape)}: torch holds "
            f"{t.dtype} {per} to an element ({_DTYPES[t.dtype]}), so its last dimension must be "
            f"a multiple of {per}")
    return (*t.shape[:-1], t.shape[-1] // per)


def _check_byteorder() -> None:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise NotImplementedError("safetensors are little-endian; this host is big-endian")


def _wanted(filter: Filter) -> Callable[[str], bool]:
    if filter is None:
        return lambda name: True
    if callable(filter):
        return filter
    if isinstance(filter, (str, bytes)):
        # A string is a collection of its characters: filter="lm_head.weight" loaded nothing.
        raise ConfigurationError(f"filter={filter!r} is one string; pass a collection of "
                                 f"names (filter=[{filter!r}]) or a predicate on names")
    try:
        names = frozenset(filter)
    except TypeError:
        raise ConfigurationError(f"filter must be a predicate on tensor names or a collection "
                                 f"of names, got {type(filter).__name__}") from None
    return names.__contains__


def _device(device: str | torch.device | None) -> torch.device:
    try:
        dev = torch.device(device if device is not None else "cpu")
    except (RuntimeError, TypeError, ValueError) as exc:  # torch's bare error names no option
        raise ConfigurationError(f"device={device!r} is not a torch device; "
                                 "use 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type == "cuda":
        # Said before anything is read (torch would fail at the first pinned allocation).
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)")
            raise ConfigurationError(f"device={str(device)!r} was requested but CUDA is not "
                                     f"available: {why}; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise ConfigurationError(f"device={str(device)!r} was requested but only "
                                     f"{torch.cuda.device_count()} CUDA device(s) are visible")
    return dev


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous tensor's memory (any dtype, 0-dim included)."""
    # Flattened by as_strided, not reshape: torch calls a tensor of one element contiguous
    # whatever its strides (``w[:, 0][0:1]``: stride 5), and reshape kept that stride,
    # which a dtype view refuses (save raised a bare RuntimeError).
    array: Any = t.as_strided((t.numel(),), (1,)).view(torch.uint8).numpy()
    return memoryview(array).cast("B")


class SafetensorsFile:
    """One open safetensors object: its validated header and its reader."""

    def __init__(self, uri: str | os.PathLike[str] | ParsedURI, options: dict[str, Any], *,
                 exact: bool = False) -> None:
        _check_byteorder()
        self.reader: StreamReader = ts_open(uri, "rb", **options)
        try:
            self.where = self.reader.name
            self.header = self._read_header(exact)
        except BaseException:
            self.reader.close()
            raise

    def _read_header(self, exact: bool) -> Header:
        """The validated header. ``exact``: with one small ranged read (64 KiB;
        more only for a larger header) instead of the read-ahead engine, for a
        group load whose ranks each read the header but must pull no tensor
        bytes twice."""
        size = self.reader.size
        first = bytearray(min(size, _EXACT_FIRST_READ if exact else _FIRST_READ))
        if exact:
            self.reader.read_ranges([(0, first)])
        else:
            # A fork, so the main reader's read-ahead starts cleanly at the data.
            with self.reader.fork(end=len(first)) as head:
                head.readinto(first)
        return header_from_prefix(bytes(first), size, self.where, self.read_at)

    def read_at(self, offset: int, nbytes: int) -> bytes:
        """``nbytes`` at ``offset``: one ranged read beside the sequential ones."""
        buf = bytearray(nbytes)
        self.reader.read_ranges([(offset, buf)])
        return bytes(buf)

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def select(self, wanted: Callable[[str], bool], names: frozenset[str] | None) -> list[TensorInfo]:
        """The tensors to read, in file order; ``names``: those an index takes from here."""
        tensors = [t for t in self.header.tensors
                   if (names is None or t.name in names) and wanted(t.name)]
        if names is not None:
            present = {t.name for t in tensors}
            missing = sorted(n for n in names if n not in present and wanted(n))
            if missing:
                raise MalformedFileError(
                    f"{self.where} lacks {len(missing)} tensor(s) that the index puts there: "
                    f"{', '.join(shown(n) for n in missing[:10])}")
        for t in tensors:  # fail on an unknown dtype or shape before reading anything
            torch_dtype(t.dtype, self.where)
            torch_shape(t, self.where)
        return tensors

    def read_tensor(self, t: TensorInfo, reader: StreamReader, *, pin: bool = False) -> torch.Tensor:
        """Allocate ``t`` in host memory and fill it with one ``readinto`` of its span."""
        return self.fill(t, reader, self.allocate(t, pin=pin))

    #: The allowance of the load that opened the file (``max_tensor_bytes``), if any.
    max_tensor_bytes: int | None = None

    def allocate(self, t: TensorInfo, *, pin: bool = False) -> torch.Tensor:
        """``t``'s memory, uninitialized (pinned for a GPU); a tensor larger than the
        host memory available is refused first (torch's allocator raised a bare
        ``RuntimeError``, or the process was killed once the pages were touched)."""
        if t.nbytes >= SMALL_CLAIM or self.max_tensor_bytes is not None:
            check_fits(t.nbytes, torch.device("cpu"), self.max_tensor_bytes, self.where,
                       count=1, detail=f" (tensor {t.name!r})",
                       hint=None if self.max_tensor_bytes is not None else _SLICE_HINT)
        return torch.empty(torch_shape(t, self.where), dtype=torch_dtype(t.dtype, self.where),
                           pin_memory=pin)

    def fill(self, t: TensorInfo, reader: StreamReader, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` (from :meth:`allocate`) with one ``readinto`` of ``t``'s span."""
        if t.nbytes:
            reader.seek(t.begin)
            view = byte_view(out)
            got = reader.readinto(view)
            if got != len(view):  # pragma: no cover - the reader raises first
                raise MalformedFileError(f"{self.where} is truncated in tensor {t.name!r}")
        return out


_SLICE_HINT = ("If the file is right, free memory, or read the tensor in parts "
               "(tensorstream.safetensors.open(...).get_slice(name)[...])")


_PACKED_TORCH = frozenset(d for d in (getattr(torch, _DTYPES[n], None) for n in PACKED)
                          if isinstance(d, torch.dtype))


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


def _casts(have: torch.dtype, dtype: torch.dtype | None) -> bool:
    """Whether ``dtype=`` casts a tensor of dtype ``have``: floating-point ones only (a
    packed dtype, F4's float4_e2m1fn_x2, has no cast: it is kept, as integers are)."""
    return (dtype is not None and have.is_floating_point and have != dtype
            and have not in _PACKED_TORCH)


def _finish(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    if device.type != "cpu":
        # From pinned memory: the copy overlaps the next tensor's read.
        t = t.to(device, non_blocking=True)
    if dtype is not None and _casts(t.dtype, dtype):
        t = t.to(dtype)
    return t


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
    with SafetensorsFile(source.uri, options) as f:
        f.max_tensor_bytes = max_tensor_bytes
        tensors = f.select(wanted, source.names)
        if not tensors:  # a file with no tensors, or none wanted: its header was checked
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


def _needed(sources: list[Source], wanted: Callable[[str], bool]) -> list[Source]:
    """The shards an index says hold at least one wanted tensor (others are not opened)."""
    return [s for s in sources if s.names is None or any(wanted(n) for n in s.names)]


def _check(device: str | torch.device | None, num_readers: int | None,
           dtype: torch.dtype | None = None) -> tuple[torch.device, int]:
    """The device and reader count (0: the default), checked before anything is read."""
    dev = _device(device)
    # A string, a float or a bool was taken as is (num_readers="2": a bare TypeError later).
    readers: int | None = validate_options({"num_readers": num_readers})["num_readers"]
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point
                                  and dtype not in _PACKED_TORCH):
        # A dtype that is no torch.dtype failed after every byte was read (dtype="float16":
        # torch's "Invalid device string"); an integer or bool dtype turned every
        # floating-point weight into integers (transformers refuses one too).
        raise ConfigurationError(f"dtype={dtype!r} is not a floating-point torch.dtype; dtype "
                                 "casts the floating-point tensors (torch.float16, "
                                 "torch.bfloat16...), others keep theirs")
    return dev, readers or 0


def load(
    uri: str | os.PathLike[str] | ParsedURI,
    device: str | torch.device = "cpu",
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
    holding one. ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"``: each tensor
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
    sources = _needed(resolve(uri, options), wanted)
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


def _shared(uri: str | os.PathLike[str] | ParsedURI, device: str | torch.device,
            dtype: torch.dtype | None, filter: Filter, num_readers: int | None, group: Any,
            options: dict[str, Any], allowance: int | None = None,
            ) -> Iterator[tuple[str, torch.Tensor]]:
    early: BaseException | None = None
    dev = torch.device("cpu")
    wanted: Callable[[str], bool] = _wanted(None)
    try:
        dev, _ = _check(device, num_readers, dtype)
        wanted = _wanted(filter)
    except Exception as exc:
        early = exc  # told to the group at its first step: every rank raises
    return _load_shared(uri, options, wanted, dev, dtype, group, early, allowance)


# -- a load shared by a torch.distributed group (group=) -----------------------------
# Every rank resolves the same sources, reads each header with one small exact
# read, allocates every wanted tensor in host memory (pinned for a GPU) and plans
# the same shares of each file (distributed.plan.split over the tensors' spans).
# Each rank reads its shares straight into the tensors' memory; the shares are
# broadcast from and into that memory (gloo) or through the staging buffer
# (NCCL); every rank then moves the complete tensors to its device. Nothing is
# handed out until every rank has succeeded.


class _File:
    """One opened source: its header, the wanted tensors (allocated) and their pieces."""

    def __init__(self, source: Source, options: dict[str, Any], wanted: Callable[[str], bool],
                 pin: bool, allowance: int | None) -> None:
        self.file = SafetensorsFile(source.uri, options, exact=True)
        try:
            self.infos: list[TensorInfo] = sorted(self.file.select(wanted, source.names),
                                                  key=lambda t: t.begin)
            # every wanted tensor is allocated in host memory now (as a load of its own
            # allocates them): more than there is was the allocator's bare RuntimeError
            check_fits(sum(t.nbytes for t in self.infos), torch.device("cpu"), allowance,
                       self.file.where, count=len(self.infos))
            self.tensors = [torch.empty(torch_shape(t, self.file.where),
                                        dtype=torch_dtype(t.dtype, self.file.where),
                                        pin_memory=pin) for t in self.infos]
        except BaseException:
            self.file.close()
            raise
        self.pieces = [Piece(t.begin, out.reshape(-1).view(torch.uint8))
                       for t, out in zip(self.infos, self.tensors, strict=True) if t.nbytes]

    def describe(self) -> tuple[Any, ...]:
        reader = self.file.reader
        return (reader.size, reader.etag, [(t.name, t.dtype, t.begin, t.end) for t in self.infos])


def _load_shared(uri: str | os.PathLike[str] | ParsedURI, options: dict[str, Any],
                 wanted: Callable[[str], bool], device: torch.device, dtype: torch.dtype | None,
                 group: Group, early: BaseException | None, allowance: int | None = None,
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """Read the tensors of ``uri`` once for the whole group; yields ``(name,
    tensor)`` on ``device`` (file order, shard by shard) once every rank has them.

    ``early``: this rank's failure before the load (a bad device...), told to
    the group at its first step.
    """
    where = redact(str(uri))
    files: list[_File] = []
    try:
        error = early
        if error is None:
            try:
                for source in _needed(resolve(uri, options), wanted):
                    files.append(_File(source, options, wanted, device.type == "cuda",
                                       allowance))
                held_by: dict[str, str] = {}
                for f in files:
                    for t in f.infos:
                        if t.name in held_by:
                            raise MalformedFileError(f"tensor {shown(t.name)} is in more than one "
                                                     f"file: {held_by[t.name]} and {f.file.where}")
                        held_by[t.name] = f.file.where
            except Exception as exc:
                error = exc
        agree(group, f"opening {where}", error,
              fingerprint(*(f.describe() for f in files)) if error is None else 0,
              local=is_local(uri))
        plans = [split(f.pieces, group.size) for f in files]
        error = None
        try:
            mine = [(f, plan[group.rank]) for f, plan in zip(files, plans, strict=True)]
            if len(mine) <= 1:
                for f, share in mine:
                    read_share(f.file.reader, share)
            else:
                with concurrent.futures.ThreadPoolExecutor(
                        min(MAX_CONCURRENT_FILES, len(mine))) as pool:
                    for fut in [pool.submit(read_share, f.file.reader, share) for f, share in mine]:
                        fut.result()
        except Exception as exc:
            error = exc
        agree(group, f"reading {where}", error)
        for f, plan in zip(files, plans, strict=True):
            broadcast_shares(group, plan, f"exchanging {f.file.where}")
        out: list[tuple[str, torch.Tensor]] = []
        error = None
        try:
            for f in files:
                for t, tensor in zip(f.infos, f.tensors, strict=True):
                    out.append((t.name, _finish(tensor, device, dtype)))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:
            error = exc
        agree(group, f"loading {where}", error)
    finally:
        for f in files:
            f.file.close()
    yield from out
