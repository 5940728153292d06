"""The part buffers of an object whose parts are larger than ``--part-size`` (S3 takes at
most 10,000 parts: a 5 TiB object's are 525 MiB): fewer at once, so that they take no more
than the copy's own pool, or 2 GiB; planned without moving TiB (:func:`pool_count`), and
one small copy end to end (S3's part limit lowered) through moto and the fault proxy."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tensorstream.copy import sinks
from tensorstream.copy.engine import DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, copy, spare_buffers
from tensorstream.copy.sinks import LARGE_PART_MEMORY, pool_count
from tensorstream.providers.s3.parts import MAX_OBJECT_SIZE, MAX_PARTS, known_size_part
from tensorstream.providers.s3.writer import S3Writer

MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("size", [1 * GiB, 78 * GiB, 100 * GiB, 600 * GiB, 2 * TiB,
                                  MAX_OBJECT_SIZE])
@pytest.mark.parametrize(("concurrency", "asked"), [
    (DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE), (8, 5 * MiB), (64, 64 * MiB), (1, 5 * MiB)])
def test_the_buffers_of_any_object_stay_bounded(size: int, concurrency: int,
                                                asked: int) -> None:
    """A 5 TiB object at the defaults had 40 buffers of 525 MiB (21 GiB). Every size now
    stays within the copy's own pool or 2 GiB, whichever is more, keeps the whole pool
    where its parts are the size asked, and has at least 2 (one filling, one sent)."""
    full = concurrency + spare_buffers(concurrency)
    part = known_size_part(size, asked, MAX_PARTS)
    count = pool_count(full, part, asked)
    assert 2 <= count <= full
    assert count * part <= max(full * asked, LARGE_PART_MEMORY) or count == 2
    if part <= asked:
        assert count == full
    else:  # as many as the memory allows: one more would pass it
        assert count == full or count == 2 or (count + 1) * part > max(full * asked,
                                                                       LARGE_PART_MEMORY)


def test_the_numbers_at_the_default_settings() -> None:
    """What docs/cli.md says: 320 MiB of buffers up to 78 GiB objects; 600 GiB: 33 parts of
    62 MiB at once (2 GiB; it was 40, 2.4 GiB); 5 TiB: 3 of 525 MiB (it was 40: 21 GiB)."""
    full = DEFAULT_CONCURRENCY + spare_buffers(DEFAULT_CONCURRENCY)
    assert full * DEFAULT_PART_SIZE == 320 * MiB

    def plan(size: int) -> tuple[int, int]:
        part = known_size_part(size, DEFAULT_PART_SIZE, MAX_PARTS)
        return part, pool_count(full, part, DEFAULT_PART_SIZE)

    assert plan(78 * GiB) == (DEFAULT_PART_SIZE, 40)
    part, count = plan(600 * GiB)
    assert (part >> 20, count) == (61, 33) and count * part <= 2 * GiB
    part, count = plan(MAX_OBJECT_SIZE)
    assert (part >> 20, count) == (524, 3) and count * part <= 2 * GiB


def test_an_object_of_larger_parts_sends_fewer_at_once_and_says_so(
        tensorstream_s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """End to end, S3's limits lowered (6 parts, no 2 GiB floor): 60 MiB in parts of 10 MiB
    with ``--part-size 5M --concurrency 4`` (a pool of 5 x 5 MiB) has 2 buffers, so at most
    2 uploads at once (it was 5); the copy is whole and the summary's note says why."""
    monkeypatch.setattr(S3Writer, "max_parts", 6)
    monkeypatch.setattr(sinks, "LARGE_PART_MEMORY", 0)
    b = tensorstream_s3
    data = os.urandom(60 * MiB)
    (tmp_path / "big.bin").write_bytes(data)
    now = {"in": 0, "peak": 0}

    async def count_uploads(method: str, path: str) -> None:
        if method == "PUT":
            now["in"] += 1
            now["peak"] = max(now["peak"], now["in"])
            await asyncio.sleep(0.3)  # (the answer comes after: the part stays in flight)
            now["in"] -= 1

    b.faults.raw.before_forward = count_uploads
    r = copy(str(tmp_path / "big.bin"), b.uri("big.bin"), part_size=5 * MiB, concurrency=4,
             **b.options)
    assert r.ok, r.errors
    assert b.get("big.bin") == data
    assert 1 <= now["peak"] <= 2, now
    (note,) = r.notes
    assert "6 parts of 10 MiB" in note and "2 at once" in note and "--concurrency" in note


def test_objects_of_larger_parts_are_copied_one_at_a_time(
        tensorstream_s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each such object's buffers are bounded, and so is their sum: two of them (parts of
    10 and 9 MiB, two pools of 2) were copied at once with ``--jobs 2``, 4 parts in
    flight; now one after the other, 2 at most. Objects of ordinary parts go on beside."""
    monkeypatch.setattr(S3Writer, "max_parts", 6)
    monkeypatch.setattr(sinks, "LARGE_PART_MEMORY", 0)
    b = tensorstream_s3
    src = tmp_path / "src"
    src.mkdir()
    files = {"a.bin": os.urandom(60 * MiB), "b.bin": os.urandom(54 * MiB), "c.bin": b"c"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    now = {"in": 0, "peak": 0}

    async def count_uploads(method: str, path: str) -> None:
        if method == "PUT" and not path.endswith("c.bin"):
            now["in"] += 1
            now["peak"] = max(now["peak"], now["in"])
            await asyncio.sleep(0.3)
            now["in"] -= 1

    b.faults.raw.before_forward = count_uploads
    r = copy(str(src), b.uri("d/"), recursive=True, part_size=5 * MiB, concurrency=4, jobs=3,
             **b.options)
    assert r.ok and r.files == 3, r.errors
    for name, data in files.items():
        assert b.get(f"d/{name}") == data
    assert 1 <= now["peak"] <= 2, now
