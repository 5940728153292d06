"""One open safetensors object (:class:`SafetensorsFile`): its header, read with
one bounded first read and validated before anything is allocated, and its
reader; each tensor allocated in its final memory (refused first when the host
cannot hold it) and filled by one ``readinto`` of its span."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..api import open as ts_open
from ..errors import MalformedFileError, NotFoundError
from ..file import StreamReader
from ..headroom import SMALL_CLAIM, check_fits
from ..uri import ParsedURI, parse_uri
from .dtypes import LEAVE_OUT, _check_byteorder, byte_view, torch_dtype, torch_shape
from .header import Header, TensorInfo, header_from_prefix, shown
from .sources import Source, missing_shard, with_prefix_hint

__all__ = ["SafetensorsFile"]

#: The first read: the length and, almost always, the whole header.
_FIRST_READ = 1 << 20
#: The first read of a group load's header (each rank reads it: kept small).
_EXACT_FIRST_READ = 64 << 10


class SafetensorsFile:
    """One open safetensors object: its validated header and its reader."""

    def __init__(self, uri: str | os.PathLike[str] | ParsedURI, options: dict[str, Any], *,
                 exact: bool = False, source: Source | None = None) -> None:
        """``source``: the :class:`~.sources.Source` ``uri`` is, for a missing shard's error
        to name the index that named it, and the tensors it was to hold."""
        _check_byteorder()
        try:
            self.reader: StreamReader = ts_open(uri, "rb", **options)
        except NotFoundError as exc:  # "s3://b/llama": a prefix is named with its "/"
            hinted = with_prefix_hint(exc, parse_uri(uri), "load")
            if source is not None:
                hinted = missing_shard(hinted, source)
            if hinted is exc:
                raise
            raise hinted from exc
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

    def select(self, wanted: Callable[[str], bool], names: frozenset[str] | None, *,
               hint: str = LEAVE_OUT) -> list[TensorInfo]:
        """The tensors to read, in file order; ``names``: those an index takes from here.
        ``hint``: what to do about a tensor torch has no dtype for (FP6)."""
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
            torch_dtype(t.dtype, self.where, tensor=t.name, hint=hint)
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
        return torch.empty(torch_shape(t, self.where),
                           dtype=torch_dtype(t.dtype, self.where, tensor=t.name),
                           device="cpu", pin_memory=pin)

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
