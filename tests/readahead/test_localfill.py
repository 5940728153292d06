"""ChunkFill's chunks: pieces of large spans, gathered runs of small ones."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tensorstream.readahead import localfill
from tensorstream.readahead.localfill import ChunkFill

FILE = bytes((i * 7) % 251 for i in range(1 << 17))


def _fill(spans: list[tuple[int, int]], *, gather: bool) -> tuple[ChunkFill[bytearray],
                                                                  list[list[int]]]:
    fill: ChunkFill[bytearray] = ChunkFill(spans, lambda i: bytearray(spans[i][1]),
                                           lambda b: memoryview(b), upfront=False, gather=gather)
    reads: list[list[int]] = []

    def read_at(offset: int, buffers: Sequence[memoryview]) -> None:
        reads.append([b.nbytes for b in buffers])
        for b in buffers:
            b[:] = FILE[offset:offset + b.nbytes]
            offset += b.nbytes

    fill.read_chunks(read_at)
    return fill, reads


@pytest.fixture(autouse=True)
def chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localfill, "CHUNK", 1000)


def _check(fill: ChunkFill[bytearray], spans: list[tuple[int, int]]) -> None:
    for i, (begin, n) in enumerate(spans):
        assert fill.take_ready(i) == FILE[begin:begin + n], i


def test_neighbours_smaller_than_a_chunk_are_read_together_with_the_gaps() -> None:
    spans = [(0, 300), (310, 300), (620, 300), (930, 100), (1040, 900), (1950, 50)]
    fill, reads = _fill(spans, gather=True)
    _check(fill, spans)
    # 0..920 fits a chunk; 930..1030 would not (a new run); 930..1940 neither
    assert reads == [[300, 10, 300, 10, 300], [100], [900, 10, 50]]


def test_without_gathering_every_span_is_its_own_read() -> None:
    spans = [(0, 300), (310, 300), (620, 2500)]
    fill, reads = _fill(spans, gather=False)
    _check(fill, spans)
    assert reads == [[300], [300], [1000], [1000], [500]]


@pytest.mark.parametrize("spans", [
    [(0, 100), (100 + localfill.MAX_GAP + 1, 100)],  # too far apart
    [(0, 100), (50, 100)],  # overlapping (not file order)
    [(0, 100), (100, 1000), (1100, 100)],  # a chunk-sized span between
    [(0, 100), (100, 0), (100, 100)],  # an empty span between
])
def test_runs_stop_at_far_overlapping_large_or_empty_neighbours(
        spans: list[tuple[int, int]]) -> None:
    fill, reads = _fill(spans, gather=True)
    _check(fill, spans)
    assert all(len(r) == 1 for r in reads)


def test_a_run_never_holds_more_buffers_than_the_kernel_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localfill, "CHUNK", 1 << 16)
    spans = [(i * 3, 2) for i in range(2000)]  # 2 bytes of data, 1 between
    fill, reads = _fill(spans, gather=True)
    _check(fill, spans)
    assert max(len(r) for r in reads) <= localfill.MAX_BUFFERS
    assert sum(len(r) // 2 + 1 for r in reads) == len(spans)


def test_a_failed_gathered_read_fails_every_span_of_it() -> None:
    spans = [(0, 100), (100, 100), (200, 100)]
    fill: ChunkFill[bytearray] = ChunkFill(spans, lambda i: bytearray(100),
                                           lambda b: memoryview(b), upfront=True, gather=True)

    def broken(offset: int, buffers: Sequence[memoryview]) -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        fill.read_chunks(broken)
    for i in range(3):
        assert fill.take_ready(i) is None
        with pytest.raises(OSError):
            fill.complete(i, broken)
