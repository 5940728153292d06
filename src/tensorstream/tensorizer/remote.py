"""Whole tensorizer loads of a remote object onto the CPU: threads fetch, tensorizer parses.

Why: tensorizer's reader thread reads each tensor's header (two reads) and its
data (one read) in turn, each read a trip through the reader's layers, and it
receives the bytes itself: for thousands of small tensors that thread, not the
link, is the limit (measured in docs/benchmarks.md, "Session 25"; tensorizer's
own curl stream receives in another process).

Here the file is cut as the in-place path cuts it (:func:`.inplace.plan`: a
block per tensor of at least 64 KiB, its data followed by the next header and
small tensors), every block is allocated and announced to the read-ahead
before the load starts, and fetcher threads read the file while tensorizer's
one reader thread parses it: each fetcher reads a contiguous share through its
own reader (the opened stream for the first share, a fork for the others:
each read-ahead engine adapts to the link as before), one ``readinto`` per
block (received in place in every mode) or per stretch between blocks (held
as bytes until served, at most :data:`_MAX_HELD` of them).

tensorizer's reader thread then never touches the stream: its read of a
tensor's data into the armed block waits until the block has landed, its
reads of headers and small tensors are copied out of the pieces holding them,
and its seeks move only its own position (:meth:`RemoteRun.received`,
``CheckedSource`` in detached mode). A failed fetch fails the run: the tensor
it touched, and every later one, raises instead of being handed out.

Taken for a whole, unencrypted, eager load onto the CPU of an object whose
tensors lie back to back (:func:`applies`); anything else keeps the in-place
path of :mod:`.inplace`.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..file import StreamReader
from . import inplace
from .checked import CheckedSource
from .hook import FilledTensorDeserializer

__all__ = ["STRETCH", "RemoteRun", "RemoteTensorDeserializer", "applies", "pieces", "shares"]

def applies(entries: Sequence[Any]) -> bool:
    """Whether ``entries`` (tensorizer ``TensorEntry``, file order) lie back to back
    (each header right after the previous tensor's data) with data to read."""
    end = None
    for e in entries:
        if e.data_length != e.deserialized_length or (end is not None and e.offset != end):
            return False
        end = int(e.data_offset) + int(e.data_length)
    return bool(entries)


#: The most bytes of one read of a stretch between blocks.
STRETCH = 4 << 20
#: Bytes of stretches between blocks one fetcher reads ahead of tensorizer's parsing, at most.
_MAX_HELD = 64 << 20


@dataclasses.dataclass
class _Piece:
    """A stretch of the file one fetcher reads with one ``readinto``: an in-place
    block (``memory``: the block's allocation, announced) or a stretch no block
    covers (headers and small tensors, read into ``data``)."""

    start: int
    end: int
    memory: torch.Tensor | None = None
    view: memoryview | None = None
    data: bytearray | None = None
    landed: bool = False
    share: int = 0  # the fetcher that reads it


def pieces(entries: Sequence[Any], blocks: Sequence[inplace.Block] | None = None) -> list[_Piece]:
    """The blocks of :func:`.inplace.plan` (``blocks``, when planned already) and the
    stretches between them, covering ``entries`` back to back from the first
    header to the last tensor's end."""
    out: list[_Piece] = []

    def stretch(start: int, end: int) -> None:
        for lo in range(start, end, STRETCH):  # (a file of tiny tensors is all stretch)
            out.append(_Piece(lo, min(end, lo + STRETCH)))

    at = int(entries[0].offset)
    for b in inplace.plan(entries) if blocks is None else blocks:
        stretch(at, b.start)
        memory = torch.empty(b.end - b.start, dtype=torch.uint8, device="cpu")
        out.append(_Piece(b.start, b.end, memory, memory.numpy().data.cast("B")))
        at = b.end
    stretch(at, int(entries[-1].data_offset) + int(entries[-1].data_length))
    return out


def shares(sizes: Sequence[int], parts: int) -> list[range]:
    """Contiguous runs of ``sizes`` with about the same sum each (at most ``parts``)."""
    total = sum(sizes)
    out: list[range] = []
    start, acc, share = 0, 0, total / max(1, parts)
    for i, n in enumerate(sizes):
        if i > start and acc >= share * (len(out) + 1) and len(out) < parts - 1:
            out.append(range(start, i))
            start = i
        acc += n
    out.append(range(start, len(sizes)))
    return out


class _Stopped(Exception):
    """The run was stopped before a waited-for piece landed."""


class RemoteRun(inplace.Run):
    """One eager load's file, fetched piece by piece by up to ``fetchers`` threads
    (one contiguous share each: the first through ``source``, the others through
    forks of it) while tensorizer's reader thread parses it from memory."""

    def __init__(self, checked: Any, entries: Sequence[Any], source: StreamReader,
                 fetchers: int) -> None:
        super().__init__([], checked._headers)
        self._checked = checked
        blocks = inplace.plan(entries)
        self._pieces = pieces(entries, blocks)
        self._starts = [p.start for p in self._pieces]
        for b in blocks:
            if b.nbytes:
                piece = self._pieces[bisect.bisect_right(self._starts, b.start) - 1]
                assert piece.memory is not None and piece.start == b.start
                self._claims[b.header] = piece.memory[: b.nbytes]
        self._addresses = {p.start: p.memory.data_ptr() for p in self._pieces
                           if p.memory is not None}
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self._stopped = False
        self._shares = shares([p.end - p.start for p in self._pieces], fetchers)
        #: The first share's reader is the opened stream (its first request goes on);
        #: each other share reads through a fork of it.
        self.forks = [source.fork() for _ in self._shares[1:]]
        self._readers = [source, *self.forks]
        for k, share in enumerate(self._shares):
            for i in share:
                self._pieces[i].share = k
        # Per fetcher, bytes of stretches read and not yet served (bounded: _MAX_HELD).
        # Per fetcher: tensorizer reads the shares in order, so a later share's bytes wait
        # for the earlier shares; one bound for all would stop the fetcher it waits for.
        self._held = [0] * len(self._shares)
        self._threads: list[threading.Thread] = []

    # -- fetcher side ------------------------------------------------------------
    def start(self) -> None:
        for k, (reader, share) in enumerate(zip(self._readers, self._shares, strict=False)):
            t = threading.Thread(target=self._fetch_share, args=(reader, share, k),
                                 name=f"tensorstream-fetch-share-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """No more reads; every fetcher has returned (nothing writes afterwards) and
        the forks are closed."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []
        for fork in self.forks:
            fork.close()

    def _fetch_share(self, reader: StreamReader, share: range, k: int) -> None:
        try:
            self._fetch(reader, share, k)
        except BaseException as exc:  # kept; raised where a tensor or header is awaited
            with self._cond:
                if self.error is None:
                    self.error = exc
                self._cond.notify_all()

    def _fetch(self, reader: StreamReader, share: range, k: int) -> None:
        if not share:
            return
        mine = [self._pieces[i] for i in share]
        # Every block is announced: read-ahead lands in it in every mode, as the in-place
        # path's blocks (the stretches between them go through read-ahead buffers).
        reader.set_read_boundaries(sorted({x for p in mine for x in (p.start, p.end)}))
        reader.set_readahead_end(mine[-1].end)
        for p in mine:
            if p.view is not None:
                reader.expect(p.start, p.view)
        reader.seek(mine[0].start)
        for p in mine:
            if self._halted():
                return
            if p.view is not None:
                self._read(reader, p.start, p.view)
            else:
                with self._cond:  # bounded: tensorizer serves these as it parses
                    while self._held[k] > _MAX_HELD and not self._halted():
                        self._cond.wait()
                    self._held[k] += p.end - p.start
                p.data = bytearray(p.end - p.start)
                self._read(reader, p.start, memoryview(p.data))
            with self._cond:
                p.landed = True
                self._cond.notify_all()

    def _read(self, reader: StreamReader, pos: int, view: memoryview) -> None:
        if reader.tell() != pos:
            reader.seek(pos)
        if reader.readinto(view) != len(view):  # pragma: no cover - the reader raises first
            raise self._checked.malformed(
                f"the object ended before offset {pos + len(view)} (truncated while loading?)",
                expected=pos + len(view))

    def _halted(self) -> bool:
        return self._stopped or self.error is not None

    # -- tensorizer's reader thread ---------------------------------------------
    def before_read(self, reader: Any, pos: int, nbytes: int) -> None:
        """Nothing to allocate: every block was allocated before the fetchers started."""

    def detached(self) -> bool:
        return True

    def _landed(self, p: _Piece) -> None:
        if p.landed and self.error is None:  # (set under the lock once its bytes are in)
            return
        with self._cond:
            while not p.landed:
                if self.error is not None:
                    raise self.error
                if self._stopped:
                    raise _Stopped("the load was stopped before this stretch was read")
                self._cond.wait()
            if self.error is not None:
                raise self.error

    def received(self, pos: int, view: memoryview) -> bool:
        """Whether ``[pos, pos + len(view))`` is served here (once this returns): a
        tensor's data in its own block's memory (waits until it landed), or the
        bytes copied into ``view`` out of the pieces holding them."""
        n = len(view)
        i = bisect.bisect_right(self._starts, pos) - 1
        if i < 0 or not n or pos + n > self._pieces[-1].end:
            return False
        p = self._pieces[i]
        if pos == p.start and p.memory is not None and inplace.address(view) == self._addresses[p.start]:
            self._landed(p)  # tensorizer's armed allocation: the block itself
            return True
        done = 0
        while done < n:
            p = self._pieces[i]
            self._landed(p)
            at = pos + done - p.start
            take = min(n - done, p.end - p.start - at)
            source = p.view if p.view is not None else p.data
            assert source is not None
            view[done:done + take] = source[at:at + take]
            done += take
            if p.data is not None and at + take == p.end - p.start:
                with self._cond:  # served to its end: tensorizer reads each byte once
                    p.data = None
                    self._held[p.share] -= p.end - p.start
                    self._cond.notify_all()
            i += 1
        return True


class RemoteTensorDeserializer(FilledTensorDeserializer):
    """A :class:`StreamTensorDeserializer` of a remote object loaded whole onto the
    CPU whose tensors are fetched by :class:`RemoteRun`'s threads; tensorizer runs
    one reader thread (it parses, verifies and builds; the threads fetch).

    ``num_readers``: the fetcher threads, each with its own share of the file and
    its own read-ahead (default: the remote default, 1 for a one-thread server).
    A load the run does not apply to (tensors not back to back, a filtered or
    encrypted load) is read by tensorizer's one reader thread in place.
    """

    def __init__(self, file_obj: Any, *args: Any, num_readers: int | None = None,
                 **kwargs: Any) -> None:
        self._ts_fetchers = max(1, num_readers or 1)
        super().__init__(file_obj, *args, num_readers=1, **kwargs)

    def _bulk_load_uncached(self, keys: Any, verify_hash: bool | None = None) -> Any:
        checked, source = self._file, self._source
        entries = sorted((e for e in map(self._metadata.get, keys) if e is not None),
                         key=lambda e: e.offset)
        if (not keys or not isinstance(checked, CheckedSource)
                or not isinstance(source, StreamReader) or self._device.type != "cpu"
                or self._encrypted or len(entries) != len(keys) or not applies(entries)):
            yield from super()._bulk_load_uncached(keys, verify_hash)
            return
        run = RemoteRun(checked, entries, source, self._ts_fetchers)
        # Kept beside tensorizer's forks so a load's statistics sum every reader's.
        self.__dict__.setdefault("_ts_forks", []).extend(run.forks)
        self._ts_threads = max(getattr(self, "_ts_threads", 0), len(run.forks) + 1)
        yield from self._filled(run, keys, verify_hash)

