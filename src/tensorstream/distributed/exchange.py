"""The collectives of a group load: agreeing on success, exchanging the shares.

Every collective runs with ``async_op=True`` and is waited for with the
group's timeout (or ``group_timeout``), so a rank that died or stopped
answering makes the others raise :class:`DistributedLoadError` instead of
waiting forever (gloo reports a dead peer at once: its connection closes).

Failure is decided together: before the exchange, and once more after every
rank built its tensors, each rank contributes its status to one
``all_gather`` (a failed flag, a fingerprint of its plan, and the first bytes
of its error message). If any rank failed, every rank raises the same error
naming the failed ranks and their errors.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ..errors import DistributedLoadError
from ..file import StreamReader
from ..uri import parse_uri, redact_text
from .group import Group
from .plan import Piece

__all__ = ["DEFAULT_CHUNK", "agree", "agreed", "broadcast_shares", "gather_ints", "is_local",
           "read_share"]

_T = TypeVar("_T")

#: Bytes moved by one broadcast at most: bounds staging memory (NCCL: on the GPU).
DEFAULT_CHUNK = 64 << 20
#: Pieces this small are packed together into one broadcast (fewer collectives).
_SMALL = 1 << 20
#: Bytes of each rank's error message carried by the status collective.
_MESSAGE = 400
#: What stands for the middle of a message longer than :data:`_MESSAGE`.
_ELIDED = b" ... "
_STATUS = struct.Struct("<qq")


def _wait(group: Group, what: str, start: Callable[[], Any]) -> None:
    """Run one collective (``start`` returns its work handle) and wait for it."""
    try:
        work = start()
        if group.timeout is None:
            work.wait()
        else:
            work.wait(group.timeout)
    except DistributedLoadError:
        raise
    except Exception as exc:
        limit = (f"{group.timeout.total_seconds():g} s" if group.timeout is not None
                 else "the group's timeout")
        raise DistributedLoadError(
            f"{what}: a collective of the {group.size}-rank group failed on rank {group.rank} "
            f"({type(exc).__name__}: {redact_text(str(exc))[:300]}); another rank died or did "
            f"not answer within {limit}. If every rank is alive but slow (a large share, a "
            "slow link), pass a group_timeout= above the slowest rank's read; after a broken "
            "collective the group cannot be used again (as for any torch collective): "
            "restart the ranks") from exc


def _describe(error: BaseException) -> str:
    """``error``'s redacted text as UTF-8, at most :data:`_MESSAGE` bytes (a longer
    one keeps its start and its end, where the advice is). It runs before this
    rank joins the status collective, so it must not raise: a lone surrogate (a
    file name that is not UTF-8) was a UnicodeEncodeError here, and the peers
    waited in the collective this rank never joined."""
    try:
        text = redact_text(f"{type(error).__name__}: {error}")
    except Exception:  # an exception whose __str__ fails
        text = f"{type(error).__name__} (its message could not be read)"
    data = text.encode("utf-8", "backslashreplace")
    if len(data) > _MESSAGE:
        # Both ends: what failed opens the text and what to do closes it (a long
        # path in between cut the advice off).
        head = _MESSAGE * 3 // 5
        data = data[:head] + _ELIDED + data[len(data) - (_MESSAGE - head - len(_ELIDED)):]
    return data.decode("utf-8", "ignore")


def agree(group: Group, what: str, error: BaseException | None, fingerprint: int = 0, *,
          local: bool = False) -> None:
    """Raise :class:`DistributedLoadError` on every rank if any rank passed an
    ``error``, or if the ranks' ``fingerprint`` s differ; return on all ranks
    otherwise. ``what`` names the step (for the message); ``local``: the object
    is a local file (its version is per machine: say so if the prints differ)."""
    status = torch.zeros(_STATUS.size + _MESSAGE, dtype=torch.uint8, device="cpu")
    message = _describe(error).encode() if error is not None else b""
    packed = _STATUS.pack(1 if error is not None else 0, fingerprint) + message
    status[: len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    mine = status.to(group.device)
    gathered = [torch.empty_like(mine) for _ in range(group.size)]
    _wait(group, what, lambda: dist.all_gather(gathered, mine, group=group.pg, async_op=True))
    failed: dict[int, str] = {}
    prints: dict[int, list[int]] = {}  # each fingerprint's ranks, in rank order
    for r, t in enumerate(gathered):
        raw = bytes(t.cpu().numpy())
        flag, fp = _STATUS.unpack(raw[: _STATUS.size])
        if flag:
            failed[r] = raw[_STATUS.size :].rstrip(b"\0").decode("utf-8", "ignore")
        prints.setdefault(fp, []).append(r)
    if failed:
        listed = "; ".join(f"rank {r}: {m}" for r, m in failed.items())
        raise DistributedLoadError(
            f"{what} failed on {len(failed)} of {group.size} ranks ({listed}); every rank of "
            "the group raises this error and no tensor is returned",
            failed_ranks=sorted(failed), errors=failed) from error
    if len(prints) > 1:
        # which ranks agree with which: the odd one out is the rank to look at
        seen = "; ".join(("ranks " + ", ".join(map(str, rs)) if len(rs) > 1 else f"rank {rs[0]}")
                         + (" saw one" if i == 0 else " another")
                         for i, rs in enumerate(list(prints.values())[:8]))
        raise DistributedLoadError(
            f"{what}: the ranks of the group do not see the same object ({seen}; this is rank "
            f"{group.rank}): size, version, tensor index or filter_func differ between ranks; "
            "a shared load needs the same URI, the same object version and the same "
            "arguments on every rank (an object replaced while the ranks opened it: load "
            "again)"
            + (" (a local file's version is its inode and mtime: copies on several machines "
               "differ even when their bytes do not; load them with group=None, each rank "
               "from its own disk)" if local else ""))


def gather_ints(group: Group, what: str, mine: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every rank's ``mine`` (integers, as many on every rank), in rank order."""
    tensor = torch.tensor(mine, dtype=torch.int64, device="cpu").to(group.device)
    gathered = [torch.empty_like(tensor) for _ in range(group.size)]
    _wait(group, what, lambda: dist.all_gather(gathered, tensor, group=group.pg, async_op=True))
    return [tuple(int(v) for v in t) for t in (g.cpu() for g in gathered)]


def agreed(group: Group, what: str, step: Callable[[], _T], undo: Callable[[_T], Any]) -> _T:
    """Run ``step`` (this rank's own part: nothing shared) and agree on it: a
    failure on any rank raises :class:`DistributedLoadError` on every rank
    (``undo`` drops what ``step`` returned on the ranks where it succeeded).

    A rank that raised alone went on to the caller's next collective while
    its peers waited in theirs, for the group's whole timeout.
    """
    try:
        result = step()
    except Exception as exc:
        agree(group, what, exc)
        raise  # (agree raised already)
    try:
        agree(group, what, None)
    except BaseException:
        undo(result)
        raise
    return result


def is_local(target: Any) -> bool:
    """Whether ``target`` (a URI or path) names a local file."""
    try:
        return parse_uri(target).is_local
    except Exception:  # not ours to refuse here: the open says what is wrong
        return False


def read_share(reader: StreamReader, pieces: list[Piece]) -> None:
    """Fill ``pieces`` (this rank's share, in file order) from storage with
    concurrent exact ranged reads (:meth:`~tensorstream.StreamReader.read_ranges`,
    pinned to the version seen at open), one per ``part_size`` bytes, each
    received straight into its memory; runs of small adjacent pieces (small
    tensors) share one request.

    Exact ranges, not the sequential read-ahead: its segment grid may start
    before the share and end after it, and every byte fetched past a share is
    a byte the group pulls twice.
    """
    part = max(1, reader._provider.config.transfer.part_size)
    ranges: list[tuple[int, Any]] = []
    packs: list[tuple[bytearray, list[Piece]]] = []
    run: list[Piece] = []

    def flush() -> None:
        if len(run) == 1:
            ranges.append((run[0].offset, _bytes_of(run[0])))
        elif run:
            buf = bytearray(run[-1].end - run[0].offset)
            ranges.append((run[0].offset, buf))
            packs.append((buf, list(run)))
        run.clear()

    for p in pieces:
        if p.size < _SMALL and (not run or (run[-1].end == p.offset
                                            and p.end - run[0].offset <= part)):
            run.append(p)
            continue
        flush()
        if p.size < _SMALL:
            run.append(p)
            continue
        for start in range(p.offset, p.end, part):
            piece = p.cut(start, min(p.end, start + part))
            ranges.append((piece.offset, _bytes_of(piece)))
    flush()
    reader.read_ranges(ranges)
    for buf, members in packs:
        base = members[0].offset
        for p in members:
            p.data.copy_(torch.frombuffer(buf, dtype=torch.uint8,
                                          offset=p.offset - base, count=p.size))


def _bytes_of(piece: Piece) -> memoryview:
    array: Any = piece.data.numpy()
    return memoryview(array).cast("B")


def _batches(pieces: list[Piece], chunk: int, in_place: bool) -> Iterator[list[Piece]]:
    """Broadcast units: pieces cut to ``chunk`` bytes; small ones packed together."""
    batch: list[Piece] = []
    size = 0
    for p in pieces:
        for start in range(p.offset, p.end, chunk):
            part = p.cut(start, min(p.end, start + chunk))
            if in_place and part.size >= _SMALL:
                if batch:  # in file order: what arrived is everything below a point
                    yield batch
                    batch, size = [], 0
                yield [part]  # broadcast straight from/into its memory
                continue
            if batch and size + part.size > chunk:
                yield batch
                batch, size = [], 0
            batch.append(part)
            size += part.size
    if batch:
        yield batch


def _broadcast(group: Group, what: str, data: torch.Tensor, root: int) -> None:
    _wait(group, what, lambda: dist.broadcast(data, src=root, group=group.pg, async_op=True))


def broadcast_shares(group: Group, shares: list[list[Piece]], what: str,
                     chunk: int = DEFAULT_CHUNK,
                     progress: Callable[[int], None] | None = None) -> None:
    """Every rank ends with every share's bytes: share ``r`` is broadcast from
    rank ``r``, ``chunk`` bytes at a time (staged through one ``chunk``-sized
    buffer on the collective device where memory cannot be sent in place).
    ``progress(offset)`` is called after each broadcast: every byte the load
    needs below ``offset`` is in place (shares are contiguous, in file order)."""
    staging: torch.Tensor | None = None
    for src, pieces in enumerate(shares):
        root = group.global_rank(src)
        for batch in _batches(pieces, chunk, group.in_place):
            if group.in_place and len(batch) == 1 and batch[0].size >= _SMALL:
                _broadcast(group, what, batch[0].data, root)
                if progress is not None:
                    progress(batch[-1].end)
                continue
            if staging is None:
                staging = torch.empty(chunk, dtype=torch.uint8, device=group.device)
            n = sum(p.size for p in batch)
            if group.rank == src:
                at = 0
                for p in batch:
                    staging[at : at + p.size].copy_(p.data)
                    at += p.size
            view = staging[:n]
            _broadcast(group, what, view, root)
            if group.rank != src:
                at = 0
                for p in batch:
                    p.data.copy_(view[at : at + p.size])
                    at += p.size
            if progress is not None:
                progress(batch[-1].end)
    if group.device.type == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(group.device)
