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

import inspect
import io
from collections.abc import Callable
from typing import Any

from tensorizer import TensorDeserializer
from tensorizer.serialization import CryptographyError, HashMismatchError, TensorEntry, TensorType

from ..file import StreamReader

__all__ = [
    "CryptographyError",
    "HashMismatchError",
    "StreamTensorDeserializer",
    "check_compat",
    "forks",
    "read_boundaries",
    "reader_count",
    "tensor_entries",
    "tensor_names",
]



class StreamTensorDeserializer(TensorDeserializer):
    """A ``TensorDeserializer`` that reopens a ``StreamReader`` with ``fork()``.

    Everything else is tensorizer's own behaviour; for any other source the
    base class decides. :attr:`stats` says what the load did
    (:class:`~tensorstream.tensorizer.stats.LoadStats`).
    """

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

    def _cut_requests_at_tensors(self) -> None:
        # Once the tensor index is parsed, before any tensor is read: cut
        # read-ahead segments at every tensor's header and data, so each tensor
        # lands in its buffer without a copy (forks inherit the boundaries).
        source = self._file
        if isinstance(source, StreamReader) and not getattr(self, "_ts_cut", False):
            source.set_read_boundaries(read_boundaries(self))
            self._ts_cut = True

    def _reopen_func(self) -> Callable[..., Any] | None:
        source = self._file
        if isinstance(source, StreamReader):
            self._cut_requests_at_tensors()  # num_readers > 1: before the forks

            def reopen(begin: int | None = None, end: int | None = None) -> StreamReader:
                # ``end`` is a hint: read-ahead stops there; reads past it still work.
                fork = source.fork(end=end)
                # Kept (not owned: tensorizer closes them) so a load's statistics can
                # sum every reader's (tensorstream.tensorizer.stats).
                self.__dict__.setdefault("_ts_forks", []).append(fork)
                if begin:
                    fork.seek(begin, io.SEEK_SET)
                return fork

            return reopen
        return super()._reopen_func()  # type: ignore[no-any-return]

    def _bulk_load(self, keys: Any, verify_hash: bool | None = None) -> Any:
        # Every load (eager, lazy, one reader or many) goes through here.
        self._cut_requests_at_tensors()
        return super()._bulk_load(keys, verify_hash)


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
    """How many parallel readers tensorizer settled on (after its fallbacks)."""
    return int(deserializer._num_readers)


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


def check_compat() -> None:
    """Raise ``RuntimeError`` if tensorizer's private hooks changed shape.

    Checked: ``TensorDeserializer._reopen_func(self)`` exists (it runs once the
    index is parsed) and the reader threads call the function it returns as
    ``reopen(begin=..., end=...)``; every load goes through
    ``_bulk_load(self, keys, verify_hash)``; index entries have ``data_offset`` and
    ``data_length`` (:func:`read_boundaries`);
    the attributes :func:`reader_count` and :func:`tensor_names` read exist.
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
    bulk = getattr(TensorDeserializer, "_bulk_load", None)
    if bulk is None or list(inspect.signature(bulk).parameters) != ["self", "keys", "verify_hash"]:
        problems.append("TensorDeserializer._bulk_load(self, keys, verify_hash) changed")
    fields = getattr(TensorEntry, "__slots__", ())
    for name in ("data_offset", "data_length", "type", "shape"):  # read_boundaries, tensor_entries
        if name not in fields:
            problems.append(f"tensorizer's TensorEntry has no {name!r}")
    init_src = inspect.getsource(TensorDeserializer.__init__)
    for needle in ("self._reopen = self._reopen_func()", "self._num_readers = num_readers",
                   "self._metadata"):
        if needle not in init_src:
            problems.append(f"TensorDeserializer.__init__ no longer contains {needle!r}")
    if problems:
        raise RuntimeError(
            "tensorizer's internals changed; tensorstream's parallel-reader hook "
            f"(tensorstream.tensorizer.hook) must be updated: {'; '.join(problems)}"
        )
