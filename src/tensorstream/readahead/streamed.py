"""Sequential reads on a fast link: one request, its body received in order
straight into each caller buffer.

A loader reads a file front to back (header, tensor, header, tensor...). On a
fast link (loopback, an object store next door) the reader's CPU is the
limit, and every ranged request costs it Python, header parsing and a server
round trip. Here one request covers the rest of the reader's range and every
read takes the next bytes of its body with ``recv_into`` (no GIL, no copy);
the kernel's socket buffers are the read-ahead. A small forward seek (a
filtered tensor) is skipped by reading; anything else ends the stream.

The first few MiB also probe the link: a stream slower than ``fast_rate``
while the process sat mostly idle is a slow or distant link, where many
parallel ranged requests win, and :meth:`SequentialStream.read` reports it so
the read-ahead engine can take over (:mod:`tensorstream.readahead.ranged`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

from ..errors import TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers.base import BodyStream
from ._prefault import populate

__all__ = ["SequentialStream", "cpu_bound_since"]

log = logging.getLogger("tensorstream.readahead.ranged")

#: Forward gaps up to this are read and dropped instead of a new request.
_SKIP = 1 << 20
#: Sequential reads in a row (after a jump) before a new stream is opened.
_RUN_TO_STREAM = 2
#: Bytes streamed before the link is judged.
_PROBE_BYTES = 4 << 20
#: Large reads are received in pieces of this size while probing, so a slow
#: link is noticed within one read.
_PROBE_PIECE = 1 << 20
#: Reads at least this large get their pages faulted in by a helper thread.
_HELPED_READ = 1 << 20


def cpu_bound_since(start: tuple[float, float], share: float) -> bool:
    """Whether the process (all threads) spent at least ``share`` of the wall
    time since ``start = (perf_counter(), process_time())`` on CPU: a probe that
    measured a low rate then measured the machine, not the link."""
    wall0, cpu0 = start
    wall = time.perf_counter() - wall0
    return wall > 0 and (time.process_time() - cpu0) / wall >= share


class SequentialStream:
    """The stream of one reader (not thread-safe: one reader's thread uses it)."""

    def __init__(self, provider: PolicyProvider, path: str, size: int, etag: str | None,
                 *, limit: int, fast_rate: float, busy_cpu: float,
                 helper: concurrent.futures.Executor | None = None) -> None:
        self._provider = provider
        self._path = path
        self._size = size
        self._etag = etag
        self._limit = limit
        self._fast_rate = fast_rate
        self._busy_cpu = busy_cpu
        self._body: BodyStream | None = None
        self._helper = helper
        self._run = 0  # sequential reads in a row
        self._scratch: bytearray | None = None
        self.opened = 0  # requests sent (statistics)
        self.slow_rate: float | None = None  # set once the link is judged slow
        self.broke = False  # the last read's stream broke (its rest needs a resumed read)
        self._judged = False
        self._probe_bytes = 0
        self._probe_wall = 0.0  # seconds spent opening and receiving, while probing
        self._probe_start: tuple[float, float] | None = None  # (wall, process CPU)

    def read(self, pos: int, view: memoryview, *, sequential: bool, first: bool = False) -> int:
        """Receive up to ``len(view)`` bytes at ``pos`` into ``view``; returns how
        many arrived (from the start of ``view``). ``sequential``: ``pos`` is
        where the previous read ended; ``first``: there was none. Fewer than
        asked (often 0) means the rest must be read another way: the read was
        not part of a sequential run,
        the stream broke (:attr:`broke`; the rest is for the retrying, resuming
        path), or the link was just judged slow (:attr:`slow_rate`)."""
        self.broke = False
        if self.slow_rate is not None:
            return 0
        body = self._body
        if body is not None and not (body.position <= pos <= body.position + _SKIP
                                     and pos + len(view) <= body.end):
            self.close()
            body = None
        self._run = self._run + 1 if sequential else 0
        if body is None:
            # A stream is for runs of reads: the reader's first read, or the third
            # in a row. Random access (a lazy load: jump, header, data, jump...)
            # stays on ranged requests over pooled keep-alive connections.
            if not (first or self._run >= _RUN_TO_STREAM):
                return 0
            # Opened under the retry policy: an error here is this read's error.
            body = self._open(pos, len(view))
        if body.position < pos:
            try:
                self._drop(body, pos - body.position)
            except TensorstreamError as exc:  # nothing of ``view`` arrived
                self.close()
                self.broke = True
                log.debug("stream broke while skipping (%s)", type(exc).__name__)
                return 0
        got = 0
        # Not while probing: the helper's CPU would make the process look busy.
        helper = self._start_helper(view) if self._judged else None
        try:
            while got < len(view):
                piece = len(view) - got if self._judged else min(_PROBE_PIECE, len(view) - got)
                started = time.perf_counter()
                got += body.readinto(view[got : got + piece])
                if not self._judged:
                    self._probe(piece, time.perf_counter() - started)
                    if self.slow_rate is not None:
                        self.close()
                        return got
                    if self._judged:  # a fast link: help with the rest of this read
                        helper = self._start_helper(view[got:])
        except TensorstreamError as exc:
            # Bytes that arrived before the break are valid; the rest is read by
            # the retrying path, and the next sequential read opens a new stream.
            self.close()
            self.broke = True
            got += min(getattr(exc, "received", 0) or 0, len(view) - got)
            log.debug("stream broke after %d bytes (%s)", got, type(exc).__name__)
        finally:
            if helper is not None:  # never touch the caller's buffer after returning
                concurrent.futures.wait([helper])
        return got

    def _start_helper(self, view: memoryview) -> concurrent.futures.Future[None] | None:
        """Fresh memory faults on first touch: a helper thread faults the pages
        in from the far end while this thread receives from the front."""
        if self._helper is None or len(view) < _HELPED_READ:
            return None
        try:
            return self._helper.submit(populate, view)
        except RuntimeError:  # the pool is shut down: the reader is closing
            return None

    def _open(self, pos: int, want: int) -> BodyStream:
        end = min(self._size, max(self._limit, pos + want))
        started = time.perf_counter()
        if self._probe_start is None:
            self._probe_start = (started, time.process_time())
        body = self._provider.open_range_blocking(self._path, pos, end, etag=self._etag)
        self.opened += 1
        self._body = body
        if not self._judged:  # the request's latency counts against the link
            self._probe_wall += time.perf_counter() - started
        return body

    def _drop(self, body: BodyStream, n: int) -> None:
        if self._scratch is None:
            self._scratch = bytearray(_SKIP)
        body.readinto(memoryview(self._scratch)[:n])

    def _probe(self, nbytes: int, seconds: float) -> None:
        self._probe_bytes += nbytes
        self._probe_wall += seconds
        if self._probe_bytes < _PROBE_BYTES:
            return
        self._judged = True
        rate = self._probe_bytes / max(self._probe_wall, 1e-9)
        assert self._probe_start is not None
        if rate < self._fast_rate and not cpu_bound_since(self._probe_start, self._busy_cpu):
            self.slow_rate = rate
            log.debug("stream at %.0f MB/s: a slow link, reading by parallel ranges", rate / 1e6)

    def close(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.close()
