"""Sequential reads received in place: one request, its body read in order
straight into each caller buffer.

A loader reads a file front to back (header, tensor, header, tensor...). When
the reader's CPU is the limit (loopback, an object store next door), every
ranged request costs it Python, header parsing and a server round trip. Here
one request covers the rest of the reader's range and every read takes the
next bytes of its body with ``recv_into`` (no GIL, no copy); the kernel's
socket buffers are the read-ahead. A small forward seek (a filtered tensor)
is skipped by reading; anything else ends the stream.

Whether the stream is the right way to read is not decided here: the
read-ahead engine (:mod:`tensorstream.readahead.ranged`) measures every stretch of
the load and switches between this stream and parallel ranged read-ahead
(:mod:`tensorstream.readahead.control`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import logging
import time

from ..errors import TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers.base import BodyStream, Pin
from ._prefault import populate

__all__ = ["SequentialStream"]

log = logging.getLogger("tensorstream.readahead")

#: Forward gaps up to this are read and dropped instead of a new request.
_SKIP = 1 << 20
#: Sequential reads in a row (after a jump) before a new stream is opened.
_RUN_TO_STREAM = 2
#: Reads at least this large measure how much of them had arrived already.
_MEASURED_READ = 64 << 10
#: Reads at least this large get their pages faulted in by a helper thread.
_HELPED_READ = 1 << 20


def _finished(helper: concurrent.futures.Future[None]) -> None:
    """Wait until ``helper`` has run or will never run. (``concurrent.futures.wait``
    waited for ever on a helper that the pool's ``shutdown(cancel_futures=True)``
    cancelled -- a close from another thread -- as it is never notified of that.)"""
    with contextlib.suppress(concurrent.futures.CancelledError):
        helper.exception()


class SequentialStream:
    """The stream of one reader (not thread-safe: one reader's thread uses it)."""

    def __init__(self, provider: PolicyProvider, path: str, size: int, pin: Pin | None,
                 *, limit: int, helper: concurrent.futures.Executor | None = None,
                 first: BodyStream | None = None) -> None:
        self._provider = provider
        self._path = path
        self._size = size
        self._pin = pin
        self._limit = limit
        # ``first``: a body already opened (by ``open``, with the object's size):
        # the reader's first read takes it like a stream of its own.
        self._body: BodyStream | None = first
        self._helper = helper
        self._run = 0  # sequential reads in a row
        self._scratch: bytearray | None = None
        self.opened = 0 if first is None else 1  # requests sent (statistics)
        #: Seconds spent opening requests (waiting for the first byte): paid once
        #: per stream, so not a sign that the link is the limit.
        self.open_seconds = 0.0
        self.broke = False  # the last read's stream broke (its rest needs a resumed read)
        #: The share of the last read that had not arrived when it started
        #: (``None``: unknown, a small read or a body that cannot tell).
        self.short: float | None = None

    def read(self, pos: int, view: memoryview, *, sequential: bool, first: bool = False) -> int:
        """Receive ``len(view)`` bytes at ``pos`` into ``view``; returns how many
        arrived (from the start of ``view``). ``sequential``: ``pos`` is where
        the previous read ended; ``first``: open a stream whatever came before.
        Fewer than asked means the rest must be read another way: 0 when the
        read is not part of a sequential run (random access stays on ranged
        requests), or the stream broke (:attr:`broke`: the rest is for the
        retrying, resuming path)."""
        self.broke = False
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
        helper = self._start_helper(view)
        self.short = None
        available = getattr(body, "available", None)
        if available is not None and len(view) >= _MEASURED_READ:
            ready = available()
            if ready is not None:
                self.short = max(0, len(view) - ready) / len(view)
        try:
            body.readinto(view)
            return len(view)
        except TensorstreamError as exc:
            # Bytes that arrived before the break are valid; the rest is read by
            # the retrying path, and the next sequential read opens a new stream.
            # A permanent error (a replaced object, a spent deadline) is this
            # read's error: the ranged path would only meet it again.
            self.close()
            if not exc.temporary:
                raise
            self.broke = True
            got = min(getattr(exc, "received", 0) or 0, len(view))
            log.debug("stream broke after %d bytes (%s)", got, type(exc).__name__)
            return got
        except BaseException:
            # Anything else (an interrupt, a buffer the socket refused) left the
            # body at an unknown position, closed: the next read opens a new one.
            self.close()
            raise
        finally:
            if helper is not None:  # never touch the caller's buffer after returning
                _finished(helper)

    def read_held(self, pos: int, view: memoryview) -> bool:
        """Receive ``view`` at ``pos`` from the open stream only if those bytes
        have arrived (never waits); ``False``: nothing was read. A body that
        fails here is closed: the caller's usual read opens, retries and resumes."""
        body = self._body
        if body is None or body.position != pos:
            return False
        held = getattr(body, "read_held", None)
        try:
            if held is None or not held(view):
                return False
        except (OSError, TensorstreamError, http.client.HTTPException) as exc:
            # The usual path meets it again, under the retry policy.
            log.debug("stream broke on a held read (%s)", type(exc).__name__)
            self.close()
            return False
        except BaseException:
            # Anything else (an interrupt) is the caller's; the body's position is
            # unknown, so the next read opens a new one.
            self.close()
            raise
        self._run += 1
        return True

    def held(self, pos: int) -> int:
        """Bytes at ``pos`` that :meth:`read_held` could serve now (0: none, no
        stream there, or a body that cannot tell)."""
        body = self._body
        if body is None or body.position != pos:
            return 0
        held = getattr(body, "held", None)
        try:
            return int(held()) if held is not None else 0
        except Exception:  # (a broken body: the usual read meets it)
            return 0

    def count(self, sequential: bool) -> None:
        """A read served another way (bytes already fetched) still counts
        toward a run of sequential reads."""
        self._run = self._run + 1 if sequential else 0

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
        try:
            body = self._provider.open_range_blocking(self._path, pos, end, pin=self._pin)
        finally:
            self.open_seconds += time.perf_counter() - started
        self.opened += 1
        self._body = body
        return body

    def _drop(self, body: BodyStream, n: int) -> None:
        if self._scratch is None:
            self._scratch = bytearray(_SKIP)
        body.readinto(memoryview(self._scratch)[:n])

    def close(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.close()
