"""The local provider's exact vectored read: every buffer full, in order, or an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorstream import errors
from tensorstream.providers.local import provider

DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture
def fd(tmp_path: Path):  # type: ignore[no-untyped-def]
    p = tmp_path / "f.bin"
    p.write_bytes(DATA)
    f = os.open(p, os.O_RDONLY)
    yield f
    os.close(f)


def _buffers(*sizes: int) -> list[memoryview]:
    return [memoryview(bytearray(n)) for n in sizes]


def test_buffers_are_filled_in_order_from_consecutive_bytes(fd: int) -> None:
    bufs = _buffers(100, 0, 3, 2000)
    assert provider._preadv_exact(fd, "f", 17, bufs, None) == 2103
    assert b"".join(bytes(b) for b in bufs) == DATA[17:17 + 2103]


@pytest.mark.parametrize("step", [1, 7, 99, 1000])
def test_short_answers_from_the_kernel_resume_in_the_right_buffer(
        fd: int, step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.preadv

    def stingy(f: int, buffers: list[memoryview], offset: int) -> int:
        first = buffers[0][:step]  # at most `step` bytes, only into the first buffer
        return real(f, [first], offset)

    monkeypatch.setattr(provider.os, "preadv", stingy)
    bufs = _buffers(5, 250, 1, 40)
    assert provider._preadv_exact(fd, "f", 1000, bufs, None) == 296
    assert b"".join(bytes(b) for b in bufs) == DATA[1000:1296]


def test_a_buffer_of_another_format_is_filled_by_bytes(fd: int) -> None:
    words = memoryview(bytearray(64)).cast("I")  # 16 four-byte items
    assert provider._preadv_exact(fd, "f", 8, [words], None) == 64
    assert words.tobytes() == DATA[8:72]


def test_a_range_past_the_end_raises_before_reading(fd: int) -> None:
    bufs = _buffers(10, 10)
    with pytest.raises(errors.InvalidRangeError):
        provider._preadv_exact(fd, "f", len(DATA) - 15, bufs, None)
    assert bytes(bufs[0]) == bytes(10)


def test_a_file_that_shrinks_mid_read_raises(fd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    real = os.preadv

    def shrinking(f: int, buffers: list[memoryview], offset: int) -> int:
        calls[0] += 1
        return real(f, [buffers[0][:10]], offset) if calls[0] == 1 else 0

    monkeypatch.setattr(provider.os, "preadv", shrinking)
    with pytest.raises(errors.ObjectChangedError, match="truncated"):
        provider._preadv_exact(fd, "f", 0, _buffers(50, 50), None)
