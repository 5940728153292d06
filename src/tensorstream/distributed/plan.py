"""Split the bytes a load needs into one contiguous share per rank.

A load needs a list of :class:`Piece` s: a span of the object's bytes and the
host memory those bytes go to (a tensor's memory, or a slice of one buffer
holding the object). :func:`split` cuts them into ``ranks`` shares of about
the same size, in file order, so every rank reads one stretch of the object.

Cuts fall on piece (tensor) boundaries when one lies near the ideal cut,
within an eighth of a share; otherwise a piece is cut inside. Purely
tensor-aligned shares would leave ranks idle for a model with a few huge
tensors (an embedding larger than a share, or fewer tensors than ranks); the
exchange moves bytes, so a cut inside a tensor costs nothing.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import LoadError

__all__ = ["Layout", "Packed", "Piece", "fingerprint", "merge", "split"]

#: How far (a fraction of a share) a cut may move to land on a tensor boundary.
_SNAP = 1 / 8


@dataclasses.dataclass(frozen=True)
class Piece:
    """Bytes ``[offset, offset + len(data))`` of the object, landing in ``data``
    (a 1-D ``uint8`` CPU tensor: a view of their destination)."""

    offset: int
    data: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.data.numel())

    @property
    def end(self) -> int:
        return self.offset + self.size

    def cut(self, start: int, stop: int) -> Piece:
        """Bytes ``[start, stop)`` (object offsets) of this piece."""
        return Piece(start, self.data[start - self.offset : stop - self.offset])


def _cuts(sizes: list[int], ranks: int) -> list[int]:
    """Cumulative byte positions where shares 1..ranks-1 start."""
    total = sum(sizes)
    edges, acc = [], 0
    for n in sizes:
        acc += n
        edges.append(acc)
    share = total / ranks
    cuts: list[int] = []
    for k in range(1, ranks):
        ideal = round(k * share)
        near = min(edges, key=lambda e: abs(e - ideal), default=ideal)
        at = near if abs(near - ideal) <= share * _SNAP else ideal
        cuts.append(max(at, cuts[-1] if cuts else 0))
    return cuts


def split(pieces: list[Piece], ranks: int) -> list[list[Piece]]:
    """``ranks`` shares of ``pieces`` (sorted by offset, disjoint), about equal in
    bytes, each a contiguous run of the object in file order. Empty pieces are
    dropped; a share may be empty (fewer bytes than ranks)."""
    pieces = [p for p in pieces if p.size]
    bounds = [0, *_cuts([p.size for p in pieces], ranks), sum(p.size for p in pieces)]
    shares: list[list[Piece]] = [[] for _ in range(ranks)]
    pos = 0  # cumulative position of the current piece's start
    for p in pieces:
        for r in range(ranks):
            lo, hi = max(bounds[r], pos), min(bounds[r + 1], pos + p.size)
            if lo < hi:
                shares[r].append(p.cut(p.offset + lo - pos, p.offset + hi - pos))
        pos += p.size
    return shares


def merge(pieces: list[Piece], whole: Any) -> list[Piece]:
    """Adjacent pieces of ``whole`` (sliced by object offsets: a buffer holding the
    object, or a :class:`Packed` one) as one piece: fewer reads and collectives."""
    out: list[Piece] = []
    for p in pieces:
        if out and out[-1].end == p.offset:
            start = out[-1].offset
            out[-1] = Piece(start, whole[start : p.end])
        else:
            out.append(p)
    return out


def fingerprint(*parts: object) -> int:
    """A 63-bit digest of ``parts`` (their ``repr``): ranks compare it to check
    that they planned the same load of the same object version."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Layout:
    """The bytes a load needs, ``spans`` of the object (``(start, stop)`` offsets),
    laid end to end in file order in one buffer of :attr:`size` bytes: a filtered
    load holds its tensors and the file's headers, not the whole file."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        runs: list[list[int]] = []
        for a, b in sorted((a, b) for a, b in spans if a < b):
            if runs and a <= runs[-1][1]:  # touching or overlapping: one run
                runs[-1][1] = max(runs[-1][1], b)
            else:
                runs.append([a, b])
        self.starts = [a for a, _ in runs]
        self.stops = [b for _, b in runs]
        self.at: list[int] = []  # where each run begins in the buffer
        size = 0
        for a, b in runs:
            self.at.append(size)
            size += b - a
        self.size = size

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """``(buffer position, length)`` of object bytes ``[start, stop)``, in order.
        A byte the load did not plan to read raises :class:`LoadError`: the buffer
        has no such byte, and a zero in its place would be a wrong tensor."""
        pos = start
        i = bisect.bisect_right(self.starts, pos) - 1
        while pos < stop:
            if i < 0 or pos >= self.stops[i]:  # in no run: a gap (or past the last run)
                end = self.starts[i + 1] if i + 1 < len(self.starts) else stop
                raise LoadError(
                    f"bytes {pos}-{min(stop, end) - 1} of the object were read, but a group "
                    "load fetches only the bytes its plan needs (the file's headers and the "
                    "tensors filter_func keeps); load it without group= and report this")
            n = min(stop, self.stops[i]) - pos
            yield self.at[i] + pos - self.starts[i], n
            pos += n  # the end of run i, or stop: runs never touch (a gap follows)


class Packed:
    """A buffer holding a :class:`Layout`'s bytes, sliced by object offsets
    (a slice lies in one of its runs: a view, never a copy)."""

    def __init__(self, layout: Layout, buffer: torch.Tensor) -> None:
        self.layout = layout
        self.buffer = buffer

    def __getitem__(self, key: slice) -> torch.Tensor:
        # runs never touch: a slice over two crosses a gap, which runs() refuses
        at, n = [*self.layout.runs(key.start, key.stop), (0, 0)][0]
        return self.buffer[at : at + n]
