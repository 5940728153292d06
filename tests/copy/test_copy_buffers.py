"""The copy engine's memory: bounded by the parts in flight, its chunk buffers private
anonymous maps (page-aligned, not shmem)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorstream.copy.engine import copy


def test_memory_bounded_by_parts_in_flight(tmp_path: Path) -> None:
    import tracemalloc

    from tensorstream.copy.receive import CHUNK

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(16 << 20))
    tracemalloc.start()
    try:
        result = copy(str(src), str(tmp_path / "out.bin"), part_size=64 << 10, concurrency=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok and result.verified
    # 16 MiB copied with 3 parts in flight, each through one chunk buffer (taken
    # from a free list, whichever of the data plane's threads runs the part):
    # far below the object size, whatever ran in this process before.
    assert peak < 3 * CHUNK + (1 << 20), peak


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_chunk_buffers_are_private_anonymous_maps(tmp_path: Path) -> None:
    import ctypes
    import mmap

    from tensorstream.copy import receive

    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    result = copy(str(src), str(tmp_path / "out.bin"), part_size=1 << 20, concurrency=3)
    assert result.ok and result.verified
    # A buffer the copy used (back on the free list) or a new one: either way a
    # private map (a shared anonymous one is shmem, dearer to fault in per page).
    buf = receive._take_chunk()
    try:
        holder = ctypes.c_char.from_buffer(buf)
        addr = ctypes.addressof(holder)
        del holder
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= addr < hi:
                    assert perms.endswith("p"), line
                    assert "/dev/zero" not in line, line
                    break
            else:
                pytest.fail("chunk buffer not found in /proc/self/maps")
        assert addr % mmap.PAGESIZE == 0
    finally:
        receive._give_back(buf)
