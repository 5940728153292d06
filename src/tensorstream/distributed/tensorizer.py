"""A tensorizer file read once per group: the bytes behind :func:`tensorstream.deserialize` with ``group=``.

Every rank opens the object and reads its tensor index (a few small exact
reads, no read-ahead), plans the same shares (:func:`~.plan.split`), reads
its own share straight into one host buffer, and the shares are broadcast so
every rank holds the bytes the load needs. That buffer holds only those bytes
(the file's headers and index, and the tensors ``filter_func`` keeps: a
:class:`~.plan.Layout`), so a filtered load of a file larger than memory fits
when its tensors do. The buffer is then read by tensorizer like any file
(:class:`~.memory.MemorySource`), so ``verify_hash``, encryption,
``filter_func`` and the checks of :mod:`tensorstream.tensorizer.hook` behave
exactly as in a load of its own.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..api import open as ts_open
from ..file import StreamReader
from ..headroom import check_fits, size_text
from ..tensorizer.foreign import translate
from ..tensorizer.hook import StreamTensorDeserializer
from ..tensorizer.sharding import not_a_template
from ..uri import ParsedURI
from .exchange import agree, broadcast_shares, is_local, read_share
from .group import Group
from .memory import Arrival, MemorySource, PositionedFile
from .plan import Layout, Packed, Piece, fingerprint, merge, split

__all__ = ["check_buffer", "fetch"]

#: DEBUG: how long each step of a group load took on this rank.
log = logging.getLogger("tensorstream.distributed")

#: Index reads fetch at least this much (the header and index are read in
#: several small pieces; one request usually covers them all).
_INDEX_READ = 64 << 10


class _ExactSource(PositionedFile):
    """A file over a reader for the index only: each read is one exact ranged
    read (at least ``_INDEX_READ`` bytes, cached), never the read-ahead, so the
    group pulls no tensor bytes twice. Closing it leaves the reader open."""

    def __init__(self, reader: StreamReader) -> None:
        super().__init__()
        self.reader = reader
        self.name = reader.name
        self._pos = 0
        self._cache = b""
        self._cache_at = 0

    def _extent(self) -> int:
        return self.reader.size

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        want = max(0, min(len(out), self.reader.size - self._pos))
        cached_end = self._cache_at + len(self._cache)
        if not (self._cache_at <= self._pos and self._pos + want <= cached_end):
            if self._cache_at <= self._pos <= cached_end:  # grow the cache: fetch only the rest
                start = cached_end
                keep = self._cache
            else:
                start, keep, self._cache_at = self._pos, b"", self._pos
            n = min(self.reader.size - start, max(self._pos + want - start, _INDEX_READ))
            buf = bytearray(n)
            self.reader.read_ranges([(start, buf)])
            self._cache = keep + bytes(buf)
        at = self._pos - self._cache_at
        out[:want] = self._cache[at : at + want]
        self._pos += want
        return want

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no file descriptor")

    def known(self) -> tuple[int, bytes]:
        """The bytes already fetched: ``(offset, data)``."""
        return self._cache_at, self._cache


def check_buffer(buffer: int, beside: int, where: str, kept: int, *,
                 available: int | None = None) -> None:
    """Refuse a group load whose buffer of the file's bytes (``buffer``: the headers and
    the kept tensors' data) and the tensors built from it in the same memory (``beside``)
    claim more than the CPU memory available (``available``: already measured; ``None``:
    measured now). Checked apart, each could fit while both, held at once, did not."""
    both = (f"; {size_text(beside)} of it for the tensors built from them, held at once"
            if beside else "")
    check_fits(buffer + beside, torch.device("cpu"), None, where, count=kept,
               detail=f" with the file's headers (a group load holds them in memory{both})",
               hint="If the file is right, load it without group= (each rank reads it) or "
                    "fewer tensors (filter_func=)", available=available)


def _plan(reader: StreamReader, encryption: Any, filter_func: Callable[[Any], bool] | None,
          claims: Callable[[list[Any]], int] | None = None,
          ) -> tuple[list[tuple[int, int]], int, tuple[int, bytes], int, int]:
    """The byte spans the load reads, a fingerprint of them and the object
    version, the bytes the index read fetched, how many tensors it keeps and the
    bytes they hold beside the group's buffer (``claims``' answer).

    The spans: the file header and index, every tensor's header (tensorizer
    reads the headers of the tensors ``filter_func`` leaves out too), and the
    data of the tensors it keeps. ``claims`` checks the entries kept (it raises
    to refuse the load).
    """
    source = _ExactSource(reader)
    with StreamTensorDeserializer(source, device="cpu", lazy_load=True, num_readers=1,
                                  encryption=encryption) as index:
        entries = sorted(index._metadata.items(), key=lambda item: item[1].offset)
    first = entries[0][1].offset if entries else reader.size
    spans = [(0, first)]
    kept = []
    for path, entry in entries:
        keep = filter_func is None or filter_func(path.normalize_())
        if keep:
            kept.append(entry)
        spans.append((entry.offset, entry.data_offset + entry.data_length if keep
                      else entry.data_offset))
    beside = claims(kept) if claims is not None else 0
    return (spans, fingerprint(reader.size, reader.etag, spans), source.known(), len(kept),
            beside)


def _skip_known(pieces: list[Piece], whole: Packed, known: tuple[int, bytes]) -> list[Piece]:
    """This rank's share without the bytes its index read already fetched (copied
    into ``whole`` where it holds them)."""
    at, data = known
    if data:
        fetched = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        for lo, hi in zip(whole.layout.starts, whole.layout.stops, strict=True):
            lo, hi = max(lo, at), min(hi, at + len(data))
            if lo < hi:
                whole[lo:hi].copy_(fetched[lo - at : hi - at])
    out = []
    for p in pieces:
        lo, hi = max(p.offset, at), min(p.end, at + len(data))
        if lo >= hi:
            out.append(p)
            continue
        if p.offset < lo:
            out.append(p.cut(p.offset, lo))
        if hi < p.end:
            out.append(p.cut(hi, p.end))
    return out


def fetch(target: str | ParsedURI, group: Group, options: dict[str, Any], where: str, *,
          encryption: Any = None, filter_func: Callable[[Any], bool] | None = None,
          early: BaseException | None = None,
          claims: Callable[[list[Any]], int] | None = None) -> MemorySource:
    """The bytes of ``target`` that a load needs, read once by the group.

    ``early``: this rank's failure before the load started (a bad device...),
    reported to the group at its first step so every rank raises. ``claims``:
    checks the index entries the load keeps before anything is read, and gives the
    bytes their tensors will hold in this process's memory beside the group's buffer.
    """
    reader: StreamReader | None = None
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    try:
        error: BaseException | None = early
        spans: list[tuple[int, int]] = []
        fp = 0
        known: tuple[int, bytes] = (0, b"")
        kept = beside = 0
        if error is None:
            try:
                reader = ts_open(target, "rb", **options)
                spans, fp, known, kept, beside = _plan(reader, encryption, filter_func, claims)
            except Exception as exc:
                # as a load of its own words it: the group quoted tensorizer's bare
                # "CryptographyError: Tensor is encrypted, but decryption was not requested"
                error = (translate(exc, where, keyed=encryption is not None)
                         or not_a_template(target, exc) or exc)  # type: ignore[arg-type]
                if error is not exc:
                    error.__cause__ = exc
        plan_s = lap()
        agree(group, f"opening {where}", error, fp, local=is_local(target))
        agree_s = lap()
        assert reader is not None
        try:
            # The bytes the load needs are held here (their sizes: the index's word): more
            # than the memory available was torch's bare RuntimeError (or a kill once
            # touched). Only those bytes: the whole file refused a filtered load of a
            # file larger than memory whose tensors fit.
            layout = Layout(spans)
            check_buffer(layout.size, beside, where, kept)
            buffer = torch.empty(layout.size, dtype=torch.uint8, device="cpu")
            whole = Packed(layout, buffer)
            pieces = [Piece(a, whole[a:b]) for a, b in spans if a < b]
            shares = [merge(share, whole) for share in split(pieces, group.size)]
            read_share(reader, _skip_known(shares[group.rank], whole, known))
        except Exception as exc:
            error = exc
        read_s = lap()
        agree(group, f"reading {where}", error)
        wait_s = lap()
        at, data = known
        arrival = Arrival(len(data) if at == 0 else 0, reader.size)
        exchange = Exchange(group, shares, f"exchanging {where}", arrival)
        log.debug("%s rank %d/%d: plan %.3f s, agree %.3f s, read own share (%d bytes) %.3f s, "
                  "wait for the others %.3f s", where, group.rank, group.size, plan_s, agree_s,
                  sum(p.size for p in shares[group.rank]), read_s, wait_s)
        source = MemorySource(buffer.numpy(), where, origin=[reader], arrival=arrival,
                              layout=layout, size=reader.size)
        source.exchange = exchange
        return source
    finally:
        if reader is not None:
            reader.close()


class Exchange:
    """The broadcasts of a group load, in a thread of their own: tensorizer builds
    the first tensors (reading through :class:`~.memory.Arrival`) while later
    shares are still arriving. :meth:`join` must return before this process
    runs any other collective on the group (collectives are matched by order)."""

    def __init__(self, group: Group, shares: list[list[Piece]], what: str,
                 arrival: Arrival) -> None:
        self._error: BaseException | None = None
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(group, shares, what, arrival),
                                        name="tensorstream-group-exchange", daemon=True)
        self._thread.start()

    def _run(self, group: Group, shares: list[list[Piece]], what: str, arrival: Arrival) -> None:
        try:
            if group.device.type == "cuda":
                torch.cuda.set_device(group.device)
            broadcast_shares(group, shares, what, progress=arrival.advance)
        except BaseException as exc:
            self._error = exc
            arrival.fail(exc)
            return
        arrival.finish()
        log.debug("%s: exchange done in %.3f s", what, time.perf_counter() - self._started)

    def join(self) -> None:
        """Wait for the exchange; raise its error (a :class:`DistributedLoadError`)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
