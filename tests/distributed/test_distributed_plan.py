"""The plan and the exchange's batching, without processes: shares are contiguous,
balanced and in file order; broadcasts keep file order (readers wait on it)."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

from tensorstream.distributed.exchange import _SMALL, _batches
from tensorstream.distributed.memory import MemorySource
from tensorstream.distributed.plan import Layout, Packed, Piece, merge, split
from tensorstream.errors import LoadError


def _pieces(sizes: list[int], gap: int = 0) -> tuple[torch.Tensor, list[Piece]]:
    whole = torch.zeros(sum(sizes) + gap * len(sizes), dtype=torch.uint8)
    out, at = [], 0
    for n in sizes:
        out.append(Piece(at, whole[at : at + n]))
        at += n + gap
    return whole, out


def test_shares_are_contiguous_balanced_and_cover_every_byte() -> None:
    _, pieces = _pieces([1000] * 7 + [50_000, 3, 10])  # one tensor larger than a share
    for ranks in (1, 2, 3, 4, 7):
        shares = split(pieces, ranks)
        assert len(shares) == ranks
        flat = [p for s in shares for p in s]
        assert [(p.offset, p.end) for p in flat] == sorted((p.offset, p.end) for p in flat)
        assert sum(p.size for p in flat) == sum(p.size for p in pieces)
        for a, b in itertools.pairwise(flat):
            assert a.end <= b.offset
        sizes = [sum(p.size for p in s) for s in shares]
        assert max(sizes) - min(sizes) <= sum(sizes) / ranks / 4 + 1, sizes


def test_cuts_snap_to_a_tensor_boundary_when_one_is_near() -> None:
    _, pieces = _pieces([100] * 10)
    shares = split(pieces, 2)
    assert shares[0][-1].end == 500 and shares[1][0].offset == 500  # on a boundary
    _, pieces = _pieces([1000, 10])
    left, right = split(pieces, 2)
    assert left[-1].end == 505 and right[0].offset == 505  # inside the big tensor


def test_more_ranks_than_bytes_leaves_empty_shares() -> None:
    _, pieces = _pieces([2])
    shares = split(pieces, 4)
    assert sum(len(s) for s in shares) == 2 and sum(1 for s in shares if not s) == 2


def test_merge_joins_adjacent_pieces_of_one_buffer() -> None:
    whole, pieces = _pieces([10, 20, 30])
    merged = merge(pieces, whole)
    assert [(p.offset, p.size) for p in merged] == [(0, 60)]
    whole, pieces = _pieces([10, 20], gap=5)
    assert len(merge(pieces, whole)) == 2


def test_batches_keep_file_order_and_bound_their_size() -> None:
    sizes = [100, 200, _SMALL * 3, 50, _SMALL // 2, _SMALL // 2, _SMALL // 2, 7]
    _, pieces = _pieces(sizes, gap=9)
    chunk = 2 * _SMALL
    for in_place in (True, False):
        batches = list(_batches(pieces, chunk, in_place))
        flat = [p for b in batches for p in b]
        assert [p.offset for p in flat] == sorted(p.offset for p in flat)
        assert sum(p.size for p in flat) == sum(sizes)
        assert all(sum(p.size for p in b) <= chunk for b in batches)


def test_a_layout_packs_only_its_spans_and_refuses_any_other_byte() -> None:
    """A filtered group load's buffer holds its spans end to end; the file over it
    reads them at their object offsets, and a byte outside them raises (a zero in
    its place would be a wrong tensor)."""
    data = bytes(range(256)) * 4  # the object: 1024 bytes
    layout = Layout([(0, 100), (100, 150), (400, 420), (900, 1000), (500, 500)])
    assert (layout.starts, layout.stops, layout.size) == ([0, 400, 900], [150, 420, 1000], 270)
    buffer = torch.empty(layout.size, dtype=torch.uint8)
    packed = Packed(layout, buffer)
    for a, b in zip(layout.starts, layout.stops, strict=True):
        packed[a:b].copy_(torch.frombuffer(bytearray(data[a:b]), dtype=torch.uint8))
    source = MemorySource(buffer.numpy(), "mem://object", layout=layout, size=len(data))
    assert source.size == 1024 and source.seek(0, io.SEEK_END) == 1024
    source.seek(140)
    assert source.read(10) == data[140:150]
    source.seek(905)
    assert source.read(95) == data[905:1000]
    other = source.reopen(401)
    out = bytearray(19)
    assert other.readinto(out) == 19 and bytes(out) == data[401:420]
    for at, n in ((140, 11), (150, 1), (395, 10), (1000, 24), (905, -1)):
        source.seek(at)
        with pytest.raises(LoadError, match="without group="):
            source.read(n)
    source.seek(2000)
    assert source.read(5) == b""  # past the end: end of file, as any file
    with pytest.raises(LoadError, match="bytes 150-399 of the object"):
        packed[140:401]
