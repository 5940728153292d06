"""tensorstream.readahead.arena: a load's tensors in one mapping, each with a storage of
its own, small ones packed; huge pages advised only where free blocks cover them, each
faulted in once by one thread, given up when they come dear; the memory outlives the
arena object until the last tensor goes."""

from __future__ import annotations

import gc
import itertools
import random
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tensorstream.readahead import arena

MiB = 1 << 20
SIZES = [5 * MiB + 3, 100, 3 * MiB, 0, 2 * MiB, 7]

linux_thp = pytest.mark.skipif(
    sys.platform != "linux" or arena._madvise is None or not arena._thp_enabled(),
    reason="transparent huge pages are off or not Linux")


def _smaps_field(address: int, field: str) -> list[str]:
    """The values of ``field`` (``VmFlags:``, ``AnonHugePages:``...) in /proc/self/smaps
    for the mapping holding ``address``; [] when no mapping holds it."""
    values: list[str] = []
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == field:
                values = line.split()[1:]
    return values


def _vmflags(address: int) -> set[str]:
    """The VmFlags of the mapping holding ``address`` (``hg``: MADV_HUGEPAGE, ``nh``: NOHUGEPAGE)."""
    return set(_smaps_field(address, "VmFlags:"))


@pytest.fixture
def cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Huge pages are never found dear (what they cost here depends on the host)."""
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)


@linux_thp
def test_each_tensor_has_its_own_aligned_storage_in_one_mapping(cheap: None) -> None:
    memory = arena.Arena(SIZES, huge=True)
    assert memory.huge
    tensors = memory.tensors
    assert [t.numel() for t in tensors] == SIZES
    assert all(t.dtype == torch.uint8 and t.dim() == 1 for t in tensors)
    spans = []
    for t, n in zip(tensors, SIZES, strict=True):
        if not n:
            continue
        storage = t.untyped_storage()
        assert storage.nbytes() == n  # not the whole mapping: torch.save(t) writes n bytes
        align = 2 * MiB if n >= 2 * MiB else arena.ALIGN
        assert t.data_ptr() % align == 0
        spans.append((t.data_ptr(), t.data_ptr() + n))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no overlap
    assert spans[-1][1] - spans[0][0] < sum(SIZES) + 4 * MiB  # one mapping, packed
    for i, t in enumerate(tensors):
        t.fill_(i + 1)
    assert [int(t.sum()) for t in tensors] == [(i + 1) * n for i, n in enumerate(SIZES)]


@linux_thp
def test_safetensors_sees_separate_tensors(tmp_path: Path, cheap: None) -> None:
    # save_file refuses tensors that share a storage: views of one buffer would fail here.
    memory = arena.Arena(SIZES, huge=True)
    assert memory.huge
    tensors = memory.tensors
    for i, t in enumerate(tensors):
        t.fill_(i)
    state = {f"t{i}": t for i, t in enumerate(tensors)}
    save_file(state, tmp_path / "x.safetensors")
    back = load_file(tmp_path / "x.safetensors")
    assert all(torch.equal(back[k], v) for k, v in state.items())


@linux_thp
def test_the_memory_lives_until_the_last_tensor_goes(cheap: None) -> None:
    memory = arena.Arena([6 * MiB, 1 * MiB], huge=True)
    assert memory.huge
    first, second = memory.tensors
    second.fill_(9)
    del memory, first
    gc.collect()
    assert int(second.sum()) == 9 * MiB
    ptr = second.data_ptr()
    assert _vmflags(ptr)  # still mapped
    del second
    gc.collect()
    assert not _vmflags(ptr)  # unmapped with the last tensor


@pytest.mark.parametrize("sizes", [[1000, 2000], [1 * MiB] * 3, [3 * MiB + 1]])
def test_small_loads_are_plain_torch_empty(sizes: list[int]) -> None:
    # below MIN_ARENA in all: no mapping (nor huge pages)
    memory = arena.Arena(sizes, huge=True)
    assert not memory.huge
    assert [t.numel() for t in memory.tensors] == sizes
    assert "hg" not in _vmflags(memory.tensors[0].data_ptr())
    assert memory.populate(memory.tensors[0].numpy().data.cast("B")) is False  # a no-op


@linux_thp
def test_huge_pages_are_advised_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)  # never given up here
    huge = arena.Arena([8 * MiB], huge=True)
    small = arena.Arena([8 * MiB], huge=False)
    assert huge.huge and "hg" in _vmflags(huge.tensors[0].data_ptr())
    assert not small.huge and "hg" not in _vmflags(small.tensors[0].data_ptr())


@linux_thp
def test_dear_huge_pages_are_given_up_for_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)  # nothing is dear
    memory = arena.Arena([16 * MiB], huge=True)
    view = memory.tensors[0].numpy().data.cast("B")
    memory.populate(view[: 4 * MiB])
    assert memory.huge
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", -1)  # every piece is dear
    memory.populate(view[4 * MiB: 8 * MiB])
    assert not memory.huge
    assert "nh" in _vmflags(memory.tensors[0].data_ptr() + 12 * MiB)
    memory.tensors[0].fill_(3)  # still ordinary writable memory
    assert int(memory.tensors[0][-1]) == 3


@linux_thp
def test_where_the_first_huge_page_is_dear_tensors_are_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", -1)
    memory = arena.Arena([16 * MiB, 1000], huge=True)
    assert not memory.huge  # tried on the first huge page, before any thread reads
    assert not memory._length  # the mapping was dropped: each tensor a torch.empty
    flags = _vmflags(memory.tensors[0].data_ptr())
    assert "hg" not in flags and "nh" not in flags
    memory.tensors[0].fill_(1)
    assert int(memory.tensors[0].sum()) == 16 * MiB


def test_huge_pages_need_free_blocks_for_twice_the_bytes(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    info = tmp_path / "buddyinfo"
    # orders 0..10; 4 KiB pages: order 9 = 2 MiB, order 10 = 4 MiB
    info.write_text("Node 0, zone      DMA      1 1 1 1 1 1 1 1 1 1 1\n"
                    "Node 0, zone   Normal   9 9 9 9 9 9 9 9 9 3 2\n")
    monkeypatch.setattr(arena, "_BUDDYINFO", str(info))
    monkeypatch.setattr(arena.mmap, "PAGESIZE", 4096)
    assert arena._free_huge_bytes() == (1 + 3) * 2 * MiB + (1 + 2) * 4 * MiB  # 20 MiB
    monkeypatch.setattr(arena, "_thp_enabled", lambda: True)
    if arena._madvise is not None:
        assert arena.huge_pages_free(10 * MiB)
    assert not arena.huge_pages_free(10 * MiB + 1)
    monkeypatch.setattr(arena, "_BUDDYINFO", str(tmp_path / "missing"))
    assert arena._free_huge_bytes() == 0


@linux_thp
def test_small_tensors_are_packed_on_huge_pages(cheap: None) -> None:
    memory = arena.Arena([1 * MiB] * 8 + [100, 5 * MiB], huge=True)
    assert memory.huge
    small, big = memory.tensors[:8], memory.tensors[9]
    assert all("hg" in _vmflags(t.data_ptr()) for t in [*small, big])
    # packed as torch.empty aligns them; the big one starts on a huge page
    assert [b.data_ptr() - a.data_ptr() for a, b in itertools.pairwise(small)] == [MiB] * 7
    assert big.data_ptr() % (2 * MiB) == 0
    assert all(memory.populate(t.numpy().data.cast("B")) for t in memory.tensors if t.numel())
    assert _anon_huge_kib(small[0].data_ptr()) >= 8 * 1024  # the small ones' 4 huge pages


@linux_thp
def test_the_last_tensors_huge_page_lies_inside_the_mapping(cheap: None) -> None:
    # The mapping ends mid huge page; its data starts wherever mmap put it, aligned up:
    # faulting in the whole last page must stay inside the mapping (else ENOMEM, and
    # huge pages given up), wherever mmap put it (so: many mappings).
    for _ in range(12):
        memory = arena.Arena([1 * MiB, 5 * MiB + 4096], huge=True)
        assert memory.populate(memory.tensors[1].numpy().data.cast("B")) is True
        assert memory.huge


def _anon_huge_kib(address: int) -> int:
    return int((_smaps_field(address, "AnonHugePages:") or ["0"])[0])


@linux_thp
def test_each_huge_page_is_faulted_in_once_by_one_thread(cheap: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Neighbouring small tensors share huge pages: threads filling them in any order
    # fault each page in once, and each piece's pages are all there when populate returns.
    sizes = [300 * 1024 + 64 * i for i in range(40)]  # ~12 MiB: 6-7 huge pages, shared
    memory = arena.Arena(sizes, huge=True)
    assert memory.huge
    faulted: list[tuple[int, int]] = []
    real = arena.Arena._populate

    def recording(self: arena.Arena, addr: int, nbytes: int) -> None:
        faulted.append((addr, nbytes))
        real(self, addr, nbytes)

    monkeypatch.setattr(arena.Arena, "_populate", recording)
    views = [t.numpy().data.cast("B") for t in memory.tensors]
    start = threading.Barrier(4)
    answers: list[bool] = []

    def fill(order: list[int]) -> None:
        start.wait()
        for i in order:
            answers.append(memory.populate(views[i]))
            views[i][:] = bytes([i]) * len(views[i])

    orders = [list(range(40)), list(range(39, -1, -1)), list(range(0, 40, 2)) + list(range(1, 40, 2)),
              random.Random(7).sample(range(40), 40)]
    threads = [threading.Thread(target=fill, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [True] * 160
    pages = sorted(faulted)
    assert all(a % (2 * MiB) == 0 and n % (2 * MiB) == 0 for a, n in pages)
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(pages))  # no page twice
    first = memory.tensors[0].data_ptr() // (2 * MiB)
    last = (memory.tensors[-1].data_ptr() + sizes[-1] - 1) // (2 * MiB)
    # every page once: the first when the mapping was made, the rest by the threads
    assert pages[0][0] == (first + 1) * 2 * MiB
    assert sum(n for _, n in pages) == (last - first) * 2 * MiB
    assert [int(t[0]) for t in memory.tensors] == list(range(40))


@linux_thp
def test_a_piece_waits_for_the_page_another_thread_is_faulting_in(cheap: None) -> None:
    memory = arena.Arena([1 * MiB] * 8, huge=True)
    assert memory.huge
    view = memory.tensors[3].numpy().data.cast("B")  # in the mapping's second huge page
    with memory._cond:
        memory._pages[1] = arena._TAKEN  # as another thread does while it faults it in
    answer: list[bool] = []
    waiter = threading.Thread(target=lambda: answer.append(memory.populate(view)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not answer
    with memory._cond:
        memory._pages[1] = arena._DONE
        memory._cond.notify_all()
    waiter.join(5)
    assert answer == [True]


@linux_thp
def test_populate_says_whether_the_pages_are_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)
    memory = arena.Arena([16 * MiB], huge=True)
    view = memory.tensors[0].numpy().data.cast("B")
    assert memory.populate(view[:4 * MiB]) is True
    assert memory.populate(view[:4 * MiB]) is True  # already in: nothing to do
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", -1)
    assert memory.populate(view[4 * MiB: 8 * MiB]) is False  # given up on the way
    assert memory.populate(view[8 * MiB:]) is False  # 4 KiB pages: the read faults them
    assert arena.Arena([16 * MiB], huge=False).populate(view[:MiB]) is False


@linux_thp
def test_a_piece_faulted_in_is_marked_for_the_read(cheap: None) -> None:
    # ...so that the read's own fault-in pass (readahead._prefault.populate) skips it.
    from tensorstream.readahead import _prefault

    memory = arena.Arena([16 * MiB], huge=True)
    view = memory.tensors[0].numpy().data.cast("B")
    assert memory.populate(view[4 * MiB: 8 * MiB])
    start = memory.tensors[0].data_ptr() + 4 * MiB
    assert _prefault._present.span == (start, start + 4 * MiB)
    _prefault.populate(view[:100])  # (consumes the mark)


@linux_thp
def test_huge_pages_dear_on_average_are_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arena, "DEAR_NS_PER_MIB", 10**12)  # no one piece is dear
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", 10**12)
    memory = arena.Arena([40 * MiB], huge=True)
    view = memory.tensors[0].numpy().data.cast("B")
    monkeypatch.setattr(arena, "SLOW_NS_PER_MIB", -1)  # but all of them on average
    memory.populate(view[2 * MiB: 8 * MiB])  # 8 MiB so far: too few to judge
    assert memory.huge
    memory.populate(view[8 * MiB: 16 * MiB])  # 16 MiB: the average decides
    assert not memory.huge


@linux_thp
def test_memory_outside_the_mapping_is_left_alone(cheap: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A gathered read's scratch (the header between two tensors) is not the arena's:
    # populate says no and touches none of the mapping's pages.
    memory = arena.Arena([5 * MiB, 100], huge=True)
    assert memory.huge
    faulted: list[int] = []
    monkeypatch.setattr(arena.Arena, "_populate",
                        lambda self, addr, nbytes: faulted.append(addr))
    for scratch in (bytearray(300), bytearray(4 * MiB)):
        assert memory.populate(memoryview(scratch)) is False
    assert faulted == []
    assert memory.huge
    assert memory.populate(memory.tensors[0].numpy().data.cast("B")) is True
    assert faulted  # its own memory still is faulted in
