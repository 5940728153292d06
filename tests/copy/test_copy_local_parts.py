"""The parts of a copy into a local directory: each written once per chunk by the shared
receiver, and the resume journal's check of earlier parts after an interrupted copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from flaky_providers import PART, FlakyProvider, names_in

from tensorstream.copy.engine import copy


def _interrupted_resume(flaky: type[FlakyProvider], dst: Path, data: bytes) -> str:
    flaky.store["b/m.bin"] = data
    flaky.fail_from = 4 * PART
    first = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=1, resume=True,
                 retries=1)
    assert not first.ok and not dst.exists()
    assert (dst.parent / ".m.bin.tensorstream-journal.tmp").exists()
    flaky.fail_from = None
    return ".m.bin.tensorstream-partial.tmp"


def test_resume_uses_and_checks_earlier_parts(tmp_path: Path,
                                              flaky: type[FlakyProvider]) -> None:
    data = os.urandom(7 * PART + 11)
    dst = tmp_path / "m.bin"
    _interrupted_resume(flaky, dst, data)
    result = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True)
    # Old parts were checked against the journal, not the source: not "verified".
    assert result.ok and not result.verified, result.errors
    # Parts 0-3 were read before the cut; the last may not have reached the journal.
    assert result.resumed_bytes in (3 * PART, 4 * PART)
    assert dst.read_bytes() == data and names_in(tmp_path) == ["m.bin"]


def test_a_resumed_durable_copy_writes_its_new_parts_directly(
        tmp_path: Path, flaky: type[FlakyProvider]) -> None:
    from page_cache import direct_io_at, resident_pages

    if not direct_io_at(tmp_path):
        pytest.skip("the temp directory's filesystem has no O_DIRECT")
    data = os.urandom(7 * PART + 11)
    dst = tmp_path / "m.bin"
    _interrupted_resume(flaky, dst, data)
    # Without verification the earlier parts are not read back (which would
    # cache them and, by read-ahead, the rest of the file).
    result = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True,
                  verify=False)
    assert result.ok and result.resumed_bytes, result.errors
    # Both runs' parts went to the disk directly, all but the unaligned tail's page.
    assert resident_pages(dst) <= 1
    assert dst.read_bytes() == data


def test_resume_with_a_damaged_earlier_part_fails_and_starts_over(
        tmp_path: Path, flaky: type[FlakyProvider]) -> None:
    data = os.urandom(7 * PART)
    dst = tmp_path / "m.bin"
    partial = tmp_path / _interrupted_resume(flaky, dst, data)
    with open(partial, "r+b") as f:  # damage part 1, which the journal says is done
        f.seek(PART + 5)
        f.write(bytes([data[PART + 5] ^ 0xFF]))
    result = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True)
    assert not result.ok and "verification failed" in result.errors[0]
    assert names_in(tmp_path) == []  # nothing kept: the next run starts over
    again = copy("flakytest://b/m.bin", str(dst), part_size=PART, concurrency=2, resume=True)
    assert again.ok and again.resumed_bytes == 0 and dst.read_bytes() == data


def test_a_part_is_written_once_per_chunk(tmp_path: Path, http_server: Any,
                                          http_reset: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Each chunk is two thread hand-offs (the receiving thread wakes the worker,
    # which writes it and hands the connection back): a 4 MiB object is four
    # 1 MiB chunks, each written with one pwrite at its place.
    data = os.urandom(4 << 20)
    key = f"chunks/{os.urandom(4).hex()}.bin"
    http_server.put(key, data)
    writes: list[int] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, buf: Any, offset: int) -> int:
        if ".tensorstream-" in os.readlink(f"/proc/self/fd/{fd}"):
            writes.append(len(buf))
        return real_pwrite(fd, buf, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    result = copy(http_server.url(key), str(tmp_path / "c.bin"))
    assert result.ok and result.verified, result.errors
    assert writes == [1 << 20] * 4
    assert (tmp_path / "c.bin").read_bytes() == data


@pytest.mark.parametrize("cut", [None, 1_300_000])
def test_parts_are_received_by_the_shared_receiver_and_resume_exactly(
        tmp_path: Path, http_server: Any, http_reset: None, cut: int | None) -> None:
    # Parts larger than the 1 MiB chunk are received (and written) by the
    # process's receiving thread, one hand-off per part; a body cut part-way
    # has its chunk finished by the retrying read and the rest re-requested,
    # and every byte lands at its place (odd sizes: no part or chunk boundary
    # lines up with another).
    from tensorstream.providers._http import receiver as receiver_mod

    data = os.urandom(7 * (1 << 20) + 12_345)
    key = f"rcv/{os.urandom(4).hex()}.bin"
    http_server.put(key, data)
    if cut is not None:
        http_server.faults.drop_after = cut
        http_server.faults.drop_times = 2
    before = receiver_mod.receiver().receives
    result = copy(http_server.url(key), str(tmp_path / "r.bin"), part_size=(3 << 20) + 7,
                  concurrency=2)
    assert result.ok and result.verified, result.errors
    assert (tmp_path / "r.bin").read_bytes() == data
    assert receiver_mod.receiver().receives > before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.bin"]
    gets = http_server.requests_for(key, "GET")
    assert len(gets) == (3 if cut is None else 3 + 2 * 2)  # 2 cut parts: a resume + the rest
