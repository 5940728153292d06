"""Everything that touches tensorizer's *internals* lives here, and only here.

tensorizer runs ``num_readers > 1`` only on sources it can reopen
(``TensorDeserializer._reopen_func``: its own curl stream, a path, a regular
file descriptor); any other file object silently gets one reader. A
:class:`~tensorstream.StreamReader` can be reopened cheaply with
:meth:`~tensorstream.StreamReader.fork` (same object version, shared
connection pool), so :class:`StreamTensorDeserializer` overrides that one
private hook, and uses the moment it is called (the index is parsed) to hand
the stream every tensor's offsets (:func:`read_boundaries`).
:func:`check_compat` asserts the hook and the index fields still have the
shape we rely on; ``tests/test_tensorizer_compat.py`` calls it so a tensorizer upgrade
that changes it fails loudly instead of silently falling back to one reader.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import re
from collections.abc import Callable
from typing import Any

import tensorizer.serialization as _tz
from tensorizer import TensorDeserializer
from tensorizer.serialization import (
    CryptographyError,
    HashMismatchError,
    TensorEntry,
    TensorType,
    _TensorHeaderDeserializer,
    _TensorPath,
)

from ..distributed.memory import MemorySource
from ..errors import ConfigurationError, LoadError, TensorstreamError
from ..file import StreamReader
from ..uri import redact_text
from . import inplace
from .checked import _PARSE_ERRORS, CheckedSource
from .claims import check_claims
from .foreign import DecryptionError, translate

__all__ = [
    "MAGIC",
    "CheckedSource",
    "CryptographyError",
    "FileIndex",
    "FileIndexEntry",
    "HashMismatchError",
    "StreamTensorDeserializer",
    "IndexEntry",
    "check_compat",
    "checked_copy_thread",
    "forget",
    "forks",
    "index_entries",
    "read_boundaries",
    "rewind",
    "read_index",
    "reader_count",
    "tensor_entries",
    "tensor_names",
]


class _UserFilter:
    """The caller's ``filter_func`` with its exceptions marked, so they are never taken
    for a damaged file; counts the names it was asked about and the ones it chose."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.asked = 0
        self.chosen = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            verdict = self.fn(*args, **kwargs)
        except BaseException as exc:
            exc._tensorstream_user = True  # type: ignore[attr-defined]
            raise
        self.asked += 1
        self.chosen += bool(verdict)  # tensorizer takes any truthy value
        return verdict


def _in_parser(exc: BaseException) -> bool:
    """Raised while tensorizer parsed the file (a reader thread), not by a check
    of the caller's arguments."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_copy_thread":
            return True
        tb = tb.tb_next
    return False


#: numpy's error on the dtype string tensorizer writes for a dtype numpy lacks
#: ("<V2" NUL "torch.bfloat16"), shown by repr: a backslash-x00 escape.
_OPAQUE_META = re.compile(r"data type '<V\d+\\x00(torch\.\w+)' not understood")


def _masked_by_decrypt(exc: BaseException) -> bool:
    """An ``UnboundLocalError`` of tensorizer's ``_stream_decrypt`` hiding the error
    (its ``__context__``) that stopped the decryption before it began."""
    if not isinstance(exc, UnboundLocalError) or exc.__context__ is None:
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == "_stream_decrypt"


def _plain_file_keyed(deserializer: TensorDeserializer, exc: BaseException) -> bool:
    """Whether tensorizer's constructor refused decryption parameters for a file that is
    not encrypted: one without the encrypted flag, or of a version before encryption."""
    if not getattr(deserializer, "_encrypted", False):
        return False
    return (getattr(deserializer, "_has_crypt_info", None) is False
            or isinstance(exc.__cause__, _tz._FileHeader.InvalidVersionError))


class StreamTensorDeserializer(TensorDeserializer):
    """A ``TensorDeserializer`` that checks the file against its own index and
    reopens a ``StreamReader`` with ``fork()``.

    Every source is read through a :class:`CheckedSource`; a file that does
    not parse raises :class:`MalformedFileError` (a ``ValueError``) naming
    the redacted URI and the sizes, instead of ``struct.error``/``TypeError``,
    and never a tensor with zeros in it. Everything else is tensorizer's own
    behaviour; for any other source the base class decides. :attr:`stats`
    says what the load did (:class:`~tensorstream.tensorizer.stats.LoadStats`).
    """

    def __init__(self, file_obj: Any, *args: Any, max_tensor_bytes: int | None = None,
                 **kwargs: Any) -> None:
        # Read by _bulk_load, which an eager load reaches inside tensorizer's __init__.
        self._ts_max_bytes = max_tensor_bytes
        source = CheckedSource.wrap(file_obj)
        if isinstance(file_obj, StreamReader):
            # No read-ahead while tensorizer parses the index: it would be planned on a
            # grid that knows no tensor and fetch the first tensors into read-ahead
            # buffers (_prepare lifts this once the index is known).
            file_obj.set_readahead_end(0)
        chooser = None
        if kwargs.get("filter_func") is not None:
            kwargs["filter_func"] = chooser = _UserFilter(kwargs["filter_func"])
        try:
            super().__init__(source, *args, **kwargs)
        except CryptographyError as exc:
            if not _plain_file_keyed(self, exc):
                raise
            # translate() led with "wrong key or passphrase"
            raise DecryptionError(
                f"{redact_text(str(getattr(source, 'name', 'the file')))} is not encrypted, "
                "but a key was given (encryption=...): load it without one, or check that "
                "it is the file you meant") from exc
        except _PARSE_ERRORS as exc:
            if isinstance(exc, TensorstreamError | CryptographyError) or getattr(
                    exc, "_tensorstream_user", False):
                raise
            if chooser is not None and chooser.asked and not chooser.chosen:
                # tensorizer 2.12 then fails with "max_workers must be greater than 0",
                # which is no damage in the file.
                raise ConfigurationError(
                    f"filter_func selected none of the {chooser.asked} tensors in "
                    f"{redact_text(str(getattr(source, 'name', 'the file')))}: nothing to "
                    "load (it returned a false value for every name)") from exc
            opaque = _OPAQUE_META.search(str(exc)) if isinstance(exc, TypeError) else None
            if opaque is not None:
                # tensorizer sizes a meta tensor with numpy.dtype(its whole dtype string),
                # which for a dtype numpy lacks holds the torch name: a file it wrote itself
                # is not damaged, tensorizer cannot read it back (its own loader fails too).
                dtype = opaque.group(1)
                raise LoadError(
                    f"{getattr(source, 'name', 'the file')}: tensorizer cannot load a meta "
                    f"tensor (stored without data, loaded as zeros) of dtype {dtype}, which "
                    "numpy lacks; tensorizer's own TensorDeserializer fails on this file too. "
                    "Leave such tensors out with filter_func (tensorstream.inspect lists them: "
                    "nbytes 0)") from exc
            raise source.malformed(f"{type(exc).__name__}: {exc}") from exc
        try:
            self._prepare()  # lazy_load with one reader: nothing checked the index yet
        except BaseException:
            source.close()
            raise

    #: Set by :func:`tensorstream.deserialize`: builds the stats, logs the load line.
    _ts_record: Any = None

    @property
    def stats(self) -> Any:
        """A :class:`~tensorstream.tensorizer.stats.LoadStats` of this load so far
        (``None`` when not opened by :func:`tensorstream.deserialize`)."""
        return None if self._ts_record is None else self._ts_record.snapshot(self)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._ts_record is not None:
                self._ts_record.finish(self)  # a lazy load logs its line when closed

    @property
    def _source(self) -> Any:
        """The reader under the checks (a StreamReader, or a plain local file)."""
        return getattr(self._file, "inner", self._file)

    def _prepare(self) -> None:
        # Once the tensor index is parsed, before any tensor is read: check the
        # index against the object, and cut read-ahead segments at every
        # tensor's header and data, so each tensor lands in its buffer without a
        # copy (forks inherit the boundaries).
        # On the CPU, tensors are instead allocated ahead of the read-ahead and
        # received in place (tensorstream.tensorizer.inplace).
        if getattr(self, "_ts_prepared", False):
            return
        if isinstance(self._file, CheckedSource):
            self._file.check_count(self._whole_index(), self._file_header.tensor_count,
                                   self._metadata_raw)
            self._file.set_index(self._metadata.values())
        source = self._source
        if isinstance(source, StreamReader):
            source.set_readahead_end(None)
            self._ts_inplace = (isinstance(self._file, CheckedSource)
                                and self._device.type == "cpu" and not source.read_hints.inline)
            if self._ts_inplace:
                edges = inplace.Run(inplace.plan(list(self._metadata.values())), None).edges()
                source.set_read_boundaries(edges)
            else:
                source.set_read_boundaries(read_boundaries(self))
        self._ts_prepared = True

    def _whole_index(self) -> list[Any]:
        """Every entry of the file's index, as parsed before ``filter_func``."""
        entries = list(self._metadata.values())
        count = self._file_header.tensor_count
        if len(entries) != count:  # filtered, or a name repeated: parse it again, whole
            versioned = self._has_versioned_metadata
            parsed, _ = _tz._MetadataDeserializer.from_buffer(
                self._metadata_raw[_tz._MetadataDeserializer._total_len_segment.size:], count,
                versioned, _VERSIONED_METADATA if versioned else None)
            entries = list(parsed.values())
        return entries

    #: Whether a tensor of this encrypted file was decrypted (the key is right).
    _ts_decrypted = False

    #: Whether tensors are received in place (set once the index is parsed).
    _ts_inplace = False

    #: Whether one reader's read-ahead stops at the last tensor each read asks for: set by
    #: a caller that reads runs of tensors out of file order (reading on fetched bytes that
    #: the next run, elsewhere in the file, never used).
    _ts_read_to_last = False

    def _copy_thread(self, thread_idx: int, halt: Any, barrier: Any, verify_hash: bool,
                     tensor_items: Any, transfer_out_queue: Any) -> None:
        # One reader thread of tensorizer's, reading ``tensor_items`` (in file
        # order). tensorizer reports its errors through the queue: nothing here
        # may raise before its own code runs.
        run = None
        copy = functools.partial(checked_copy_thread(), self)
        try:
            source = self._source
            if thread_idx == 0 and tensor_items and isinstance(source, StreamReader):
                # The first reader reads the opened stream, whose read-ahead would run
                # on into the next reader's share (forks are told their end): 64 MiB
                # fetched twice, into read-ahead buffers, on a paced link. Alone
                # (one reader, a lazy load's tensor) it may read on.
                last = tensor_items[-1]
                alone = getattr(barrier, "parties", 1) <= 1
                end = last.data_offset + last.data_length
                source.set_readahead_end(None if alone and not self._ts_read_to_last else end)
            if self._ts_inplace and isinstance(self._file, CheckedSource):
                run = inplace.Run(inplace.plan(tensor_items), self._file._headers)
                copy = functools.partial(inplace.copy_thread(copy.func), self)
        except Exception:  # pragma: no cover - tensorizer's own path instead
            run, copy = None, functools.partial(checked_copy_thread(), self)
        with inplace.running(run):
            copy(thread_idx, halt, barrier, verify_hash, tensor_items, transfer_out_queue)

    def _reopen_func(self) -> Callable[..., Any] | None:
        self._prepare()  # num_readers > 1: before the forks
        checked = self._file
        source = self._source
        if isinstance(source, StreamReader):

            def reopen(begin: int | None = None, end: int | None = None) -> Any:
                # ``end`` is a hint: read-ahead stops there; reads past it still work.
                fork = source.fork(end=end)
                # Kept (not owned: tensorizer closes them) so a load's statistics can
                # sum every reader's (tensorstream.tensorizer.stats).
                self.__dict__.setdefault("_ts_forks", []).append(fork)
                if begin:
                    fork.seek(begin, io.SEEK_SET)
                return checked.child(fork) if isinstance(checked, CheckedSource) else fork

            return reopen
        if isinstance(source, MemorySource):  # a group load's bytes: a view, no copy

            def reopen_memory(begin: int | None = None, end: int | None = None) -> Any:
                view = source.reopen(begin)
                return checked.child(view) if isinstance(checked, CheckedSource) else view

            return reopen_memory
        base = super()._reopen_func()
        if base is None or not isinstance(checked, CheckedSource):
            return base  # type: ignore[no-any-return]

        def reopen_checked(begin: int | None = None, end: int | None = None) -> Any:
            return checked.child(base(begin, end))  # tensorizer's reopen of the same inode

        return reopen_checked

    def _bulk_load(self, keys: Any, verify_hash: bool | None = None) -> Any:
        # Every load (eager, lazy, one reader or many) goes through here, a lazy load's
        # after the constructor returned: its errors are tensorstream's from here.
        self._prepare()
        keys = list(keys)
        self._check_claims(keys)
        try:
            for item in super()._bulk_load(keys, verify_hash):
                if self._encrypted:  # the key decrypts this file (_mapped)
                    self._ts_decrypted = True
                yield item
        except BaseException as exc:
            mapped = self._mapped(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def _check_claims(self, keys: list[Any]) -> None:
        """Refuse (:class:`~tensorstream.errors.InsufficientMemoryError`) to load
        ``keys`` when the tensors not loaded yet claim more than the device can hold
        (or ``max_tensor_bytes``): before tensorizer allocates any of them."""
        cache = getattr(self, "_cache", {})
        todo = [entry for entry in (self._metadata.get(path) for path in map(_TensorPath.wrap_, keys)
                                    if cache.get(path) is None) if entry is not None]
        check_claims(todo, self._device, self._ts_max_bytes,
                     redact_text(str(getattr(self._file, "name", "the file"))))

    def _mapped(self, exc: BaseException) -> BaseException | None:
        """The tensorstream error to raise for ``exc`` (``None``: ``exc`` itself): a
        file that does not parse is MalformedFileError; tensorizer's and torch's
        errors are translated (a failed hash is TensorHashMismatchError, still a
        tensorizer HashMismatchError); the user's filter_func's are left alone."""
        if isinstance(exc, TensorstreamError) or getattr(exc, "_tensorstream_user", False):
            return None
        checked = self._file
        if _masked_by_decrypt(exc) and isinstance(checked, CheckedSource):
            # tensorizer 2.12's _stream_decrypt ends in "finally: del crypto", which raises
            # this when its decryption could not even start (a damaged crypt-info header:
            # "Number of nonces provided (0) does not match..."); that error is the one
            inner = exc.__context__
            return checked.malformed(f"the encryption header of a tensor does not parse "
                                     f"({type(inner).__name__}: {inner})")
        if (isinstance(exc, _PARSE_ERRORS) and not isinstance(exc, CryptographyError)
                and _in_parser(exc)):
            if isinstance(checked, CheckedSource):
                return checked.malformed(f"{type(exc).__name__}: {exc}")
            return None
        return translate(exc, redact_text(str(getattr(checked, "name", "the file"))),
                         decrypted=self._ts_decrypted,
                         keyed=getattr(self, "_encryption", None) is not None)


class _CheckedHeader(_TensorHeaderDeserializer):
    """tensorizer's tensor header parser, each header checked against the index
    (:meth:`CheckedSource.check_header`) when it is read through a ``CheckedSource``."""

    @classmethod
    def from_io(cls, reader: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(reader, CheckedSource):
            return super().from_io(reader, *args, **kwargs)
        pos = reader.tell()
        try:
            header = super().from_io(reader, *args, **kwargs)
        except TensorstreamError:
            raise
        except (*_PARSE_ERRORS, KeyError) as exc:  # KeyError: an unknown crypt-info chunk type
            raise reader.malformed(f"the tensor header at offset {pos} does not parse "
                                   f"({type(exc).__name__}: {exc})") from exc
        if header is not None:
            reader.check_header(pos, header)
        return header


class FilledTensorDeserializer(StreamTensorDeserializer):
    """A :class:`StreamTensorDeserializer` whose tensors other threads fill while
    tensorizer's one reader thread parses: a run (an :class:`.inplace.Run` with
    ``start``/``stop``: ``tensorizer/local.py``'s, ``tensorizer/remote.py``'s) is
    armed for that thread while :meth:`_filled` loads."""

    _ts_run: Any = None

    def _filled(self, run: Any, keys: Any, verify_hash: bool | None) -> Any:
        """tensorizer's load of ``keys`` with ``run``'s threads filling the tensors;
        every thread has returned when this ends, however it ends."""
        self._ts_run = run
        run.start()
        try:
            yield from super()._bulk_load_uncached(keys, verify_hash)
        finally:
            run.stop()
            self._ts_run = None

    def _copy_thread(self, thread_idx: int, halt: Any, barrier: Any, verify_hash: bool,
                     tensor_items: Any, transfer_out_queue: Any) -> None:
        run = self._ts_run
        if run is None:
            super()._copy_thread(thread_idx, halt, barrier, verify_hash, tensor_items,
                                 transfer_out_queue)
            return
        copy = functools.partial(inplace.copy_thread(checked_copy_thread()), self)
        with inplace.running(run):
            copy(thread_idx, halt, barrier, verify_hash, tensor_items, transfer_out_queue)


def checked_copy_thread() -> Callable[..., Any]:
    """A copy of tensorizer's ``_copy_thread`` that parses tensor headers with
    :class:`_CheckedHeader` (its module's globals copied now: nothing is patched)."""
    return inplace.with_globals(TensorDeserializer._copy_thread,
                                _TensorHeaderDeserializer=_CheckedHeader)


#: The last bytes of each tensor's data share one request with the next
#: tensor's header (copied, not received in place): one request per header
#: saved, at the price of copying this much per tensor.
_TAIL = 32 << 10


def read_boundaries(deserializer: TensorDeserializer) -> list[int]:
    """Where read-ahead segments must start, from the tensor index: at each
    tensor's data, and ``_TAIL`` bytes before its end, so that the tail and the
    next tensor's header travel in one small request while the rest of the
    data is received straight into the tensor."""
    out: list[int] = []
    for entry in deserializer._metadata.values():
        out.append(entry.data_offset)
        if entry.data_length > 2 * _TAIL:
            out.append(entry.data_offset + entry.data_length - _TAIL)
    return out


def reader_count(deserializer: TensorDeserializer) -> int:
    """How many parallel readers tensorizer settled on (after its fallbacks), or
    the threads that filled a local load's tensors (``tensorizer/local.py``) or
    fetched a remote one (``tensorizer/remote.py``)."""
    return int(getattr(deserializer, "_ts_threads", 0) or deserializer._num_readers)


def forks(deserializer: TensorDeserializer) -> list[StreamReader]:
    """The extra readers (forks) tensorizer opened for ``num_readers > 1``."""
    return list(deserializer.__dict__.get("_ts_forks", ()))


_KINDS = {TensorType.PARAM: "param", TensorType.BUFFER: "buffer", TensorType.STATE_DICT: "state_dict"}


def tensor_entries(deserializer: TensorDeserializer) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, kind, shape)`` of every tensor in the parsed index (no I/O).

    ``kind`` is ``"param"`` or ``"buffer"`` (written by ``write_module``) or
    ``"state_dict"`` (``write_state_dict``). Names are dotted, as in
    :func:`tensor_names`.
    """
    out = []
    for path, entry in deserializer._metadata.items():
        norm = path.normalize_()
        name = norm if isinstance(norm, str) else ".".join(map(str, norm))
        out.append((name, _KINDS.get(entry.type, str(entry.type)), tuple(entry.shape)))
    return out


def tensor_names(deserializer: TensorDeserializer) -> list[str]:
    """Every tensor name in the file's metadata index, as dotted strings.

    Read from the header the deserializer already parsed: no extra I/O, and
    unaffected by ``filter_func`` only in that filtered tensors are absent.
    """
    names = []
    for path in deserializer._metadata:
        norm = path.normalize_()
        names.append(norm if isinstance(norm, str) else ".".join(map(str, norm)))
    return names


@dataclasses.dataclass(frozen=True)
class IndexEntry:
    """One tensor of a parsed tensorizer index (no I/O).

    ``name``: dotted; ``key``: what ``read_tensors``' ``filter_func`` is given for
    it; ``dtype``: tensorizer's string, a numpy dtype (``"<f2"``) or, for dtypes
    numpy lacks, the stand-in and the torch name joined by a NUL
    (``"<V2", "torch.bfloat16"``); ``data_length``: the stored bytes (0 for a
    meta tensor written without data).
    """

    name: str
    key: Any
    kind: str
    dtype: str
    shape: tuple[int, ...]
    data_length: int


def index_entries(deserializer: TensorDeserializer) -> list[IndexEntry]:
    """Every tensor of the parsed index, in file order."""
    out = []
    for path, entry in deserializer._metadata.items():
        norm = path.normalize_()
        name = norm if isinstance(norm, str) else ".".join(map(str, norm))
        out.append(IndexEntry(name, norm, _KINDS.get(entry.type, str(entry.type)),
                              str(entry.dtype), tuple(entry.shape), int(entry.data_length)))
    return out


def rewind(deserializer: TensorDeserializer) -> None:
    """Let the next ``read_tensors`` start from the file's first tensor: tensorizer resumes
    after the last tensor it yielded, so a filter naming an earlier one yielded nothing
    (a pass in an order other than the file's, as a conversion to safetensors makes)."""
    deserializer._last_yielded_key = None


def forget(deserializer: TensorDeserializer, keys: Any) -> None:
    """Drop loaded tensors from a ``lazy_load`` deserializer's cache, so a pass over
    every tensor holds only the ones in use (tensorizer keeps each loaded tensor)."""
    cache = deserializer._cache
    for path in list(cache):
        if path.normalize_() in keys:
            cache[path] = None  # what lazy_load starts with: "not loaded yet"


#: The first bytes of every tensorizer file.
MAGIC: bytes = _tz.TENSORIZER_MAGIC
# The index entry versions tensorizer accepts in a file with versioned headers.
_VERSIONED_METADATA = (_tz.NON_OPAQUE_TENSORIZER_VERSION, _tz.LONG_TENSOR_TENSORIZER_VERSION)
#: A tensor index larger than this is a damaged length field, not an index.
MAX_INDEX_SIZE = 100_000_000


@dataclasses.dataclass(frozen=True)
class FileIndexEntry:
    """One tensor of a tensorizer file's index (no I/O beyond the index)."""

    name: str
    kind: str  # "param", "buffer" or "state_dict"
    dtype: str  # torch's name: "float32", "bfloat16"...
    shape: tuple[int, ...]
    header_offset: int
    data_offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class FileIndex:
    """The file header and tensor index of a tensorizer file."""

    version: int
    #: tensor data encrypted; names, dtypes and shapes are in the index in the clear
    encrypted: bool
    entries: tuple[FileIndexEntry, ...]
    #: where the index ends (the bytes :func:`read_index` needed)
    index_end: int


def _dtype_name(raw: str) -> str:
    # Opaque dtypes are written as "<V2\0torch.bfloat16"; the others as numpy's "<f4", "|i1".
    if _tz.OPAQUE_DTYPE_SEP in raw:
        return raw.split(_tz.OPAQUE_DTYPE_SEP, 1)[1].removeprefix("torch.")
    import numpy

    return str(numpy.dtype(raw).name)


def read_index(first: bytes, size: int, name: str,
               read_at: Callable[[int, int], bytes]) -> FileIndex:
    """Parse the file header and tensor index of a tensorizer file of ``size``
    bytes that starts with ``first``, with tensorizer's own parsers;
    ``read_at(offset, nbytes)`` fetches the rest of an index longer than
    ``first`` (one bounded read). Entries are checked against the object as
    :class:`CheckedSource` checks them before a load. Raises
    :class:`MalformedFileError` naming ``name``; an encrypted file needs no key."""
    checked = CheckedSource(io.BytesIO(), size, name)  # its checks, no reads
    if bytes(first[:len(MAGIC)]) != MAGIC:
        raise checked.malformed(f"it does not start with tensorizer's magic {MAGIC!r}")
    versions = (_tz.NON_OPAQUE_TENSORIZER_VERSION, _tz.OPAQUE_TENSORIZER_VERSION,
                _tz.ENCRYPTION_TENSORIZER_VERSION, _tz.META_TENSOR_TENSORIZER_VERSION,
                _tz.LONG_TENSOR_TENSORIZER_VERSION, _tz.TENSORIZER_VERSION)
    pos = len(MAGIC) + _tz._FileHeader.version_number_format.size + _tz._FileHeader.format.size
    length = _tz._MetadataDeserializer._total_len_segment
    if len(first) < pos + length.size:
        raise checked.malformed("it ends inside the file header", expected=pos + length.size)
    try:
        header = _tz._FileHeader.from_io(io.BytesIO(first[len(MAGIC):pos]), versions)
        (total,) = length.unpack_from(first, pos)
        pos += length.size
        if total > MAX_INDEX_SIZE or total > size - pos:
            raise checked.malformed(f"its index claims {total} bytes at offset {pos}",
                                    expected=pos + total)
        raw = bytes(first[pos : pos + total])
        if len(raw) < total:
            raw += read_at(pos + len(raw), total - len(raw))
        versioned = _tz._FileFeatureFlags.versioned_headers in header.feature_flags
        metadata, _ = _tz._MetadataDeserializer.from_buffer(
            raw, header.tensor_count, versioned, _VERSIONED_METADATA if versioned else None)
        entries = list(metadata.values())
        checked.check_count(entries, header.tensor_count, raw)
        checked.set_index(entries)
        out = []
        for e in entries:
            norm = e.name.normalize_()
            out.append(FileIndexEntry(norm if isinstance(norm, str) else ".".join(map(str, norm)),
                                  _KINDS.get(e.type, str(e.type)), _dtype_name(e.dtype),
                                  tuple(e.shape), e.offset, e.data_offset, e.data_length))
    except TensorstreamError:
        raise
    except _tz._FileHeader.InvalidVersionError as exc:
        raise checked.malformed(f"unsupported tensorizer data version {exc.version}") from None
    except _PARSE_ERRORS as exc:
        raise checked.malformed(f"its index does not parse ({type(exc).__name__}: {exc})") from None
    version = header.version_number
    encrypted = (version == _tz.ENCRYPTION_TENSORIZER_VERSION
                 or (version >= _tz.META_TENSOR_TENSORIZER_VERSION
                     and _tz._FileFeatureFlags.encrypted in header.feature_flags))
    return FileIndex(version, encrypted, tuple(out), pos + total)


def _inplace_problems(copy_src: str) -> list[str]:
    """What :mod:`.inplace` relies on in tensorizer's reader threads."""
    problems = []
    copy = TensorDeserializer._copy_thread
    params = list(inspect.signature(copy).parameters)
    if params != ["unsafe_self", "thread_idx", "halt", "barrier", "verify_hash", "tensor_items",
                  "transfer_out_queue"]:
        problems.append(f"_copy_thread's parameters changed: {params}")
    if copy.__closure__ or "torch" not in copy.__code__.co_names:
        problems.append("_copy_thread no longer reads the module global torch")
    flat = "".join(copy_src.split())
    if 'torch.empty((needed_buffer_size,),device="cpu",dtype=torch.uint8)' not in flat:
        problems.append("_copy_thread no longer allocates each CPU tensor with torch.empty")
    if ("_TensorHeaderDeserializer" not in copy.__code__.co_names
            or "_TensorHeaderDeserializer.from_io(" not in flat):
        problems.append("_copy_thread no longer parses headers with the module global "
                        "_TensorHeaderDeserializer.from_io (checked_copy_thread)")
    bulk = "".join(inspect.getsource(TensorDeserializer._bulk_load_uncached).split())
    if "self._copy_thread,thread_idx,halt,barrier,verify_hash,tensor_items," not in bulk:
        problems.append("_bulk_load_uncached no longer starts self._copy_thread per reader")
    return problems


def check_compat() -> None:
    """Raise ``RuntimeError`` if tensorizer's private hooks changed shape.

    Checked: ``TensorDeserializer._reopen_func(self)`` exists (it runs once the
    index is parsed) and the reader threads call the function it returns as
    ``reopen(begin=..., end=...)``; every load goes through
    ``_bulk_load(self, keys, verify_hash)``; index entries have ``data_offset`` and
    ``data_length`` (:func:`read_boundaries`);
    the attributes :func:`reader_count` and :func:`tensor_names` read exist;
    each tensor header starts with a ``header_len_segment`` read
    (:class:`CheckedSource`), and parse errors of reader threads come from
    ``_copy_thread`` (copy_src above); ``_copy_thread`` keeps its parameters,
    is started once per reader, and allocates each CPU tensor with
    ``torch.empty((needed_buffer_size,), device="cpu", dtype=torch.uint8)``
    through the module's global ``torch`` (:mod:`.inplace`); ``_bulk_load_uncached(self,
    keys, verify_hash)`` loads the tensors not yet loaded and index entries have ``offset``
    and ``deserialized_length`` (:mod:`.local`).
    """
    problems = []
    hook = getattr(TensorDeserializer, "_reopen_func", None)
    if hook is None or not callable(hook):
        problems.append("TensorDeserializer._reopen_func is gone")
    elif list(inspect.signature(hook).parameters) != ["self"]:
        problems.append(f"_reopen_func signature changed: {inspect.signature(hook)}")
    copy_src = inspect.getsource(TensorDeserializer._copy_thread)
    if "_reopen(begin=begin_offset, end=end_offset)" not in copy_src:
        problems.append("reader threads no longer call self._reopen(begin=..., end=...)")
    problems.extend(_inplace_problems(copy_src))
    if "self._cache[key] = item" not in inspect.getsource(TensorDeserializer._bulk_load):
        problems.append("_bulk_load no longer caches loaded tensors in self._cache (forget)")
    bulk = getattr(TensorDeserializer, "_bulk_load", None)
    if bulk is None or list(inspect.signature(bulk).parameters) != ["self", "keys", "verify_hash"]:
        problems.append("TensorDeserializer._bulk_load(self, keys, verify_hash) changed")
    uncached = getattr(TensorDeserializer, "_bulk_load_uncached", None)  # local.py
    if uncached is None or list(inspect.signature(uncached).parameters) != [
            "self", "keys", "verify_hash"]:
        problems.append("TensorDeserializer._bulk_load_uncached(self, keys, verify_hash) changed")
    fields = getattr(TensorEntry, "__slots__", ())
    for name in ("data_offset", "data_length", "type", "shape", "dtype",  # index_entries
                 "offset"):  # local.py
        if name not in fields:
            problems.append(f"tensorizer's TensorEntry has no {name!r}")
    if not hasattr(TensorEntry, "deserialized_length"):  # local.py
        problems.append("tensorizer's TensorEntry has no 'deserialized_length'")
    header_src = inspect.getsource(_TensorHeaderDeserializer.from_io)
    if "reader.read(cls.header_len_segment.size)" not in header_src:
        # CheckedSource checks each tensor header's length as it is read
        problems.append("tensor headers no longer start with a header_len_segment read")
    for attr in ("TENSORIZER_MAGIC", "OPAQUE_DTYPE_SEP", "_FileHeader", "_FileFeatureFlags",
                 "_MetadataDeserializer", "ENCRYPTION_TENSORIZER_VERSION",
                 "META_TENSOR_TENSORIZER_VERSION", "LONG_TENSOR_TENSORIZER_VERSION"):
        if not hasattr(_tz, attr):  # read_index
            problems.append(f"tensorizer.serialization.{attr} is gone")
    if list(inspect.signature(TensorDeserializer._bulk_load).parameters) != [
            "self", "keys", "verify_hash"]:  # StreamTensorDeserializer._bulk_load
        problems.append("TensorDeserializer._bulk_load's signature changed")
    if hasattr(_tz, "_MetadataDeserializer") and list(inspect.signature(
            _tz._MetadataDeserializer.from_buffer).parameters) != [
            "buffer", "count", "versioned", "accepted_versions"]:
        problems.append("_MetadataDeserializer.from_buffer's signature changed")
    init_src = inspect.getsource(TensorDeserializer.__init__)
    for needle in ("self._reopen = self._reopen_func()", "self._num_readers = num_readers",
                   "self._metadata", "self._metadata_raw", "self._file_header",
                   "self._has_versioned_metadata",
                   "self._cache = OrderedDict.fromkeys(self._metadata.keys())"):
        if needle not in init_src:
            problems.append(f"TensorDeserializer.__init__ no longer contains {needle!r}")
    if problems:
        raise RuntimeError(
            "tensorizer's internals changed; tensorstream's parallel-reader hook "
            f"(tensorstream.tensorizer.hook) must be updated: {'; '.join(problems)}"
        )
