"""The GIL-free copy and the page pre-faulting used on the read path."""

from __future__ import annotations

import ctypes
import gc
import mmap
import random
import resource
import sys
import threading
from collections.abc import Callable

import pytest

from tensorstream.readahead import _prefault
from tensorstream.readahead._memcopy import copy_into

SIZES = [0, 1, 4095, 64 << 10, (64 << 10) + 3, 3 << 20]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "readonly-view"])
def test_copy_into_copies_exactly(n: int, kind: str) -> None:
    data = random.Random(n).randbytes(n)
    src: bytes | bytearray | memoryview = {
        "bytes": lambda: data,
        "bytearray": lambda: bytearray(data),
        "memoryview": lambda: memoryview(bytearray(data)),
        "readonly-view": lambda: memoryview(data),
    }[kind]()
    dst = bytearray(b"\xee" * (n + 7))
    copy_into(memoryview(dst)[1:], src)
    assert dst[0] == 0xEE
    assert bytes(dst[1 : n + 1]) == data
    assert dst[n + 1 :] == b"\xee" * 6  # nothing written past the source's length


@pytest.mark.parametrize("n", [100, 1 << 20])
def test_copy_into_a_shorter_buffer_raises_without_writing_past_it(n: int) -> None:
    dst = bytearray(n + 16)
    with pytest.raises(ValueError):
        copy_into(memoryview(dst)[: n - 1], b"x" * n)
    assert dst[n - 1 :] == bytes(17)


def test_populate_keeps_contents() -> None:
    data = random.Random(3).randbytes(5 << 20)
    buf = bytearray(data)
    _prefault.populate(memoryview(buf)[123:])
    assert buf == data


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux-only")
@pytest.mark.parametrize("piece", [None, 3 << 20, 16 << 20])  # default, odd, one call
def test_populate_faults_fresh_pages_in(piece: int | None) -> None:
    if not _prefault._supported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    n = 16 << 20
    mem = mmap.mmap(-1, n)  # fresh anonymous memory: no page is present yet
    view = memoryview(mem)
    ones = b"\x01" * n
    if piece is None:
        _prefault.populate(view)
    else:
        _prefault.populate(view, piece=piece)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    view[:] = ones  # every page was populated: writing faults (almost) none
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < (n // mmap.PAGESIZE) // 4, faults
    assert view[0] == 1 and view[n - 1] == 1
    view.release()
    mem.close()


def test_populate_ignores_small_and_readonly_buffers() -> None:
    _prefault.populate(memoryview(b"x" * (2 << 20)))  # read-only: left alone, no error
    small = bytearray(100)
    _prefault.populate(memoryview(small))
    assert small == bytes(100)


def _least_garbage_left_by(run: Callable[[int], None], tries: int = 3) -> int:
    """The fewest unreachable (cyclic) objects the collector finds after
    ``run(attempt)``, over ``tries`` attempts (each should use sizes of its own).
    Other threads (servers and event loops left by earlier tests) make garbage
    now and then; garbage made per call is there every time."""
    least = None
    for attempt in range(tries):
        gc.collect()
        gc.disable()
        try:
            run(attempt)
            garbage = gc.collect()
        finally:
            gc.enable()
        least = garbage if least is None else min(least, garbage)
        if least < 16:
            break
    assert least is not None
    return least


def test_populate_makes_no_garbage_per_buffer_size() -> None:
    """Hundreds of tensors of distinct sizes: populating each must not leave
    objects behind (a ctypes array type per size did, and its cyclic garbage
    set off full collections that took a third of a local load)."""
    _prefault.populate(memoryview(bytearray(1 << 20)))  # anything made once is made now

    def populate_each(attempt: int) -> None:
        for i in range(1, 64):
            _prefault.populate(memoryview(bytearray((1 << 20) + 4096 * i + 7 + 2 * attempt)))

    garbage = _least_garbage_left_by(populate_each)
    assert garbage < 16, garbage


def test_copy_into_makes_no_garbage_per_length() -> None:
    src = bytearray(random.Random(5).randbytes((1 << 20) + 64 * 4096))
    dst = bytearray(len(src))
    copy_into(memoryview(dst), memoryview(src)[: 1 << 20])

    def copy_each_length(attempt: int) -> None:
        for i in range(1, 64):
            n = (1 << 20) + 4096 * i + 3 + 2 * attempt
            copy_into(memoryview(dst), memoryview(src)[:n])
            copy_into(memoryview(dst), bytes(src[:n]))

    garbage = _least_garbage_left_by(copy_each_length)
    assert garbage < 16, garbage
    last = (1 << 20) + 4096 * 63 + 3
    assert dst[:last] == src[:last]


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux-only")
def test_a_piece_marked_present_is_not_populated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The arena faults its huge pages in and marks the piece; the read's own pass over
    # the same piece (next populate, same thread) is skipped, once; anything else is not.
    if not _prefault._supported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    calls: list[int] = []
    real = _prefault._madvise
    assert real is not None

    def counting(addr: int, n: int, advice: int) -> int:
        calls.append(n)
        return int(real(addr, n, advice))

    monkeypatch.setattr(_prefault, "_madvise", counting)
    mem = mmap.mmap(-1, 8 << 20)
    view = memoryview(mem)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    _prefault.mark_present(addr, addr + (8 << 20))
    _prefault.populate(view[1 << 20: 5 << 20], piece=4 << 20)  # inside the span: skipped
    assert calls == []
    _prefault.populate(view[1 << 20: 5 << 20], piece=4 << 20)  # the mark was one-shot
    assert calls == [4 << 20]
    _prefault.mark_present(addr, addr + (2 << 20))
    _prefault.populate(view[1 << 20: 5 << 20], piece=4 << 20)  # not inside: populated
    assert calls == [4 << 20, 4 << 20]
    marked: list[object] = []
    thread = threading.Thread(target=lambda: marked.append(getattr(_prefault._present, "span", None)))
    _prefault.mark_present(addr, addr + (8 << 20))
    thread.start()
    thread.join()
    assert marked == [None]  # per thread
    _prefault.populate(view[:100])  # (consumes this thread's mark)
    view.release()
    mem.close()
