"""A safetensors load shared by a ``torch.distributed`` group (``load(...,
group=...)``): the ranks read each file once between them and each gets every
tensor; a failure on any rank is every rank's."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..distributed.exchange import agree, broadcast_shares, is_local, read_share
from ..distributed.group import Group
from ..distributed.plan import Piece, fingerprint, split
from ..errors import MalformedFileError
from ..headroom import check_fits
from ..uri import ParsedURI, redact
from .arguments import Filter, _check, _needed, _sources, _wanted
from .dtypes import _finish, torch_dtype, torch_shape
from .header import TensorInfo, shown
from .opened_file import SafetensorsFile
from .sources import MAX_CONCURRENT_FILES, Source

__all__: list[str] = []

def _shared(uri: str | os.PathLike[str] | ParsedURI, device: str | torch.device | int,
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
        self.file = SafetensorsFile(source.uri, options, exact=True, source=source)
        try:
            self.infos: list[TensorInfo] = sorted(self.file.select(wanted, source.names),
                                                  key=lambda t: t.begin)
            # every wanted tensor is allocated in host memory now (as a load of its own
            # allocates them): more than there is was the allocator's bare RuntimeError
            check_fits(sum(t.nbytes for t in self.infos), torch.device("cpu"), allowance,
                       self.file.where, count=len(self.infos))
            self.tensors = [torch.empty(torch_shape(t, self.file.where),
                                        dtype=torch_dtype(t.dtype, self.file.where),
                                        device="cpu", pin_memory=pin) for t in self.infos]
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
                for source in _needed(_sources(uri, options, wanted), wanted):
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
