"""One mapping for a local load's tensors, on transparent huge pages when the
kernel has them free and cheap.

Why: a local load is bound by faulting in fresh tensor memory, not by the
file (it is in the page cache). With 4 KiB pages that is one fault per page
(131k per 512 MiB; ~1.3 ms of CPU per 4 MiB here); with 2 MiB pages it is 256
faults and the kernel zeroes whole huge pages at memory speed (~0.35 ms per
4 MiB). Tensors of a few MiB or less never get huge pages from the general
allocator (they are not 2 MiB aligned), so the tensors of the load are carved
out of one private anonymous mapping advised ``MADV_HUGEPAGE`` (the Run:ai
streamer reads into one numpy array, which numpy advises the same way), small
tensors packed together. Threads filling neighbouring tensors share huge
pages: each huge page is faulted in by the first thread whose piece touches
it, and a thread whose piece touches a page another thread is faulting in
waits for it (two threads writing into one untouched huge page would each
zero one, one of them in vain).

Two catches, both handled here. With ``defrag`` set to ``madvise`` (the usual
default) a fault in an advised region that finds no free 2 MiB block compacts
memory first, which stalled loads for 0.65-1.34 s on a fragmented machine
(docs/benchmarks.md, session 3): the advice is only given when
``/proc/buddyinfo`` shows free blocks of 2 MiB or more for twice the mapping
(:func:`huge_pages_free`). And a virtual machine that hands its free memory
back to the host (virtio-balloon free page reporting: every free block of
2 MiB or more, two seconds after it was freed) pays the host's faults for
each such huge page: ~9 ms per 4 MiB, far dearer than 4 KiB pages (taken from
smaller free blocks, never handed back). The first huge page is timed before
any thread reads (dear: no mapping, each tensor a ``torch.empty`` as before),
and :meth:`Arena.populate` keeps measuring as the load goes and gives huge
pages up for the rest of the mapping once they come dear.

Each tensor gets a storage of its own over its slice of the mapping (so
``safetensors.torch.save_file``, ``torch.save`` of one tensor and storage
sharing checks see separate tensors), aligned as ``torch.empty`` aligns
(64 bytes) or, from 2 MiB, on a huge page. The mapping is unmapped when the
last of the load's tensors is freed: freeing some tensors of a load returns
no memory until then.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
from collections.abc import Sequence

import torch

from . import _prefault

__all__ = ["ALIGN", "DEAR_NS_PER_MIB", "MIN_ARENA", "SLOW_NS_PER_MIB", "Arena", "huge_pages_free"]

#: Alignment of each tensor in the mapping (``torch.empty``'s on the CPU).
ALIGN = 64
#: Loads with fewer tensor bytes allocate each tensor with ``torch.empty``
#: (a mapping of its own is not worth it below a huge page or two).
MIN_ARENA = 4 << 20
_HUGE = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_NOHUGEPAGE = 15
_MADV_POPULATE_WRITE = 23
#: Time per MiB populated, on average, above which huge pages are given
#: up: what 4 KiB pages cost here (~0.32 ms per MiB; cheap huge pages ~0.09-0.2,
#: dear ones 1.2-2.5), so huge pages are kept only while they are the cheaper.
SLOW_NS_PER_MIB = 350_000
#: The same for one piece: a dear huge page gives them up at once, where one
#: piece's cost alone (a busy machine: 0.4-0.65 ms per MiB seen for cheap ones)
#: would not.
DEAR_NS_PER_MIB = 1_000_000
#: Populated bytes before the average decides.
_AVERAGE_AFTER = 16 << 20
_BUDDYINFO = "/proc/buddyinfo"
# A huge page of the mapping: untouched, being faulted in by a thread, faulted in (or
# left to the read once huge pages were given up).
_UNTOUCHED, _TAKEN, _DONE = 0, 1, 2

# libc's madvise as the read-ahead has it (the process's own symbols: no
# `ldconfig -p` child process at import); None off Linux.
_madvise = _prefault._madvise


def _thp_enabled() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _free_huge_bytes() -> int:
    """Bytes in free blocks of 2 MiB or more (every zone, every node), from
    ``/proc/buddyinfo`` (free blocks per order: 2**order pages); 0 if unreadable."""
    page = mmap.PAGESIZE
    huge_order = max(0, (_HUGE // page).bit_length() - 1)  # 9 on 4 KiB pages
    total = 0
    try:
        with open(_BUDDYINFO) as f:
            for line in f:
                counts = line.split(",", 1)[-1].split()[2:]  # after "zone NAME"
                for order, count in enumerate(counts):
                    if order >= huge_order:
                        total += int(count) * (page << order)
    except (OSError, ValueError):
        return 0
    return total


def huge_pages_free(nbytes: int) -> bool:
    """Whether ``nbytes`` of huge pages can be had without compacting memory:
    transparent huge pages are not off and free 2 MiB blocks cover twice
    ``nbytes`` (other processes allocate too)."""
    return _madvise is not None and _thp_enabled() and _free_huge_bytes() >= 2 * nbytes


class Arena:
    """The tensors of one load (:attr:`tensors`: a 1-D ``uint8`` tensor of each
    of ``sizes`` bytes, uninitialized), each with its own storage inside one
    fresh mapping on huge pages (:data:`ALIGN`-aligned), or each a ``torch.empty``.

    ``huge``: advise huge pages (None: when :func:`huge_pages_free` says they
    are free; False: never). The mapping is only used when huge pages are
    advised and the first one came cheap; else (and below :data:`MIN_ARENA` in
    all, or with less than half the bytes in tensors of 2 MiB or more) each
    tensor is a ``torch.empty``.
    """

    def __init__(self, sizes: Sequence[int], *, huge: bool | None = None) -> None:
        offsets = []
        end = 0
        for n in sizes:
            # A tensor of a huge page or more starts on one: its chunks (cut from its
            # start) then fault whole huge pages, not one that two threads race for.
            # No memory is lost: the padding lies in the huge page the previous
            # tensor ends in, faulted whole anyway (and untouched on 4 KiB pages).
            step = _HUGE if n >= _HUGE else ALIGN
            end = -(-end // step) * step
            offsets.append(end)
            end += n
        self.huge = False
        self._base = self._length = 0
        self._spent = self._spanned = 0  # time (ns) and bytes of huge pages populated
        self._pages = bytearray()  # per huge page of the mapping: _UNTOUCHED, _TAKEN or _DONE
        self._cond = threading.Condition()
        self.tensors = self._mapped(offsets, sizes, end, huge) or [
            torch.empty(n, dtype=torch.uint8, device="cpu") for n in sizes]

    def _mapped(self, offsets: list[int], sizes: Sequence[int], end: int,
                huge: bool | None) -> list[torch.Tensor] | None:
        """The tensors in one mapping, if it gets huge pages (then :attr:`huge`),
        else None. Without huge pages the mapping is dropped: each tensor is a
        ``torch.empty`` as before (one mapping on 4 KiB pages measured no faster
        here, and up to 0.05 s of CPU slower per 512 MiB of small tensors)."""
        if end < MIN_ARENA or _madvise is None or huge is False:
            return None
        if huge is None and not huge_pages_free(end):
            return None
        # A private anonymous mapping (a shared one is shmem: no anonymous huge pages) of
        # whole huge pages, one more so that its data can start on a 2 MiB boundary.
        self._length = -(-end // _HUGE) * _HUGE
        region = mmap.mmap(-1, self._length + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = memoryview(region)
        skip = -ctypes.addressof(ctypes.c_char.from_buffer(whole)) % _HUGE
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(whole)) + skip
        self._pages = bytearray(self._length // _HUGE)
        self.huge = _madvise(self._base, self._length, _MADV_HUGEPAGE) == 0
        if self.huge:
            # One huge page first, before any thread takes a chunk: where they are dear
            # the load then pays for one (~4.5 ms here), not one per thread.
            self._fault_in(self._base, self._base + _HUGE)
        if not self.huge:  # an error (a kernel without THP), or dear huge pages
            whole.release()
            region.close()
            self._base = self._length = 0
            return None
        # Each frombuffer holds its slice's export of the mapping: it stays mapped
        # until the last tensor goes.
        return [torch.frombuffer(whole[skip + o: skip + o + n], dtype=torch.uint8)
                if n else torch.empty(0, dtype=torch.uint8, device="cpu")
                for o, n in zip(offsets, sizes, strict=True)]

    def populate(self, view: memoryview) -> bool:
        """Fault in ``view`` (a piece of :attr:`tensors`) before a read lands in it,
        and give up huge pages for the rest of the mapping if they came dear.
        Returns whether all of ``view``'s pages are present now (False: not on
        huge pages, or given up meanwhile; the caller's read faults them).

        Why: on a virtual machine that hands free memory back to its host, a
        huge page costs the host's faults of all its 4 KiB pages once its block
        has been handed back (here ~9 ms of thread CPU per 4 MiB, and more in
        wall time, against 1.3 ms on 4 KiB pages and 0.35 ms on huge pages
        freed moments ago, which are handed out first). The cost is measured in wall time (the host's part of
        it is not the guest's CPU time) per huge page the piece spans; above
        :data:`DEAR_NS_PER_MIB` for one piece, or :data:`SLOW_NS_PER_MIB` on
        average, the not yet faulted rest of the mapping goes back to 4 KiB
        pages. The first huge page is tried when the mapping is made, so where
        they are all dear a load pays for that one. (Pages already present
        cost nothing here.)
        """
        if not self.huge or not view.nbytes:
            return False
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
        if not self._base <= addr <= addr + view.nbytes <= self._base + self._length:
            return False  # not this mapping's memory (a gathered read's scratch)
        present = self._fault_in(addr, addr + view.nbytes)
        if present:  # the read's own fault-in pass (_prefault.populate) is skipped
            _prefault.mark_present(addr, addr + view.nbytes)
        return present

    def _fault_in(self, lo: int, hi: int) -> bool:
        """Fault in the huge pages under ``[lo, hi)`` that no thread has taken yet
        (runs of neighbours, one call each), then wait for those that other
        threads are faulting in. Returns :attr:`huge` afterwards."""
        first = max(0, (lo - self._base) // _HUGE)
        last = min(len(self._pages), -(-(hi - self._base) // _HUGE))
        with self._cond:
            mine = [p for p in range(first, last) if self._pages[p] == _UNTOUCHED]
            for p in mine:
                self._pages[p] = _TAKEN
        try:
            for begin, count in _runs(mine):
                if self.huge:  # (given up meanwhile: the read faults 4 KiB pages)
                    self._populate(self._base + begin * _HUGE, count * _HUGE)
                with self._cond:
                    self._pages[begin:begin + count] = bytes([_DONE]) * count
                    self._cond.notify_all()
        finally:  # (an interrupted fault-in leaves no page taken: no thread waits forever)
            with self._cond:
                for p in mine:
                    self._pages[p] = _DONE
                self._cond.notify_all()
                while _TAKEN in self._pages[first:last]:
                    self._cond.wait()
        return self.huge

    def _populate(self, addr: int, nbytes: int) -> None:
        # The huge pages the piece touches: at most what this call can fault in.
        spanned = -(-(addr + nbytes) // _HUGE) * _HUGE - addr // _HUGE * _HUGE
        assert _madvise is not None
        # Wall time, not thread CPU: a huge page from memory handed back to the host
        # costs the host's faults, which the guest's CPU clocks only partly see (the
        # rest is steal). A busy machine inflates wall time and gives huge pages up
        # sooner: that only leaves the 4 KiB pages loads had before.
        began = time.monotonic_ns()
        ok = _madvise(addr, nbytes, _MADV_POPULATE_WRITE) == 0
        spent = time.monotonic_ns() - began
        # (Threads race on these sums; a lost update only shifts the average a little.)
        self._spent += spent
        self._spanned += spanned
        mib = spanned / (1 << 20)
        if (not ok or spent > DEAR_NS_PER_MIB * mib or (
                self._spanned >= _AVERAGE_AFTER
                and self._spent > SLOW_NS_PER_MIB * self._spanned / (1 << 20))):
            self.huge = False
            _madvise(self._base, self._length, _MADV_NOHUGEPAGE)


def _runs(pages: list[int]) -> list[tuple[int, int]]:
    """``(first, count)`` of each run of consecutive numbers in sorted ``pages``."""
    runs: list[tuple[int, int]] = []
    for p in pages:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs
