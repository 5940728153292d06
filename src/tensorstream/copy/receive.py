"""Receiving one part of a source object, chunk by chunk, in a worker thread.

``cp`` runs each part as one call of :func:`receive_part` on the data plane's
worker threads (:func:`tensorstream.providers._http.threads.in_thread`):
the part's bytes arrive in a small buffer (``CHUNK`` bytes, taken from a
free list for the part and reused for every chunk of it, so it stays in
cache and is never faulted in again) and are handed to ``deliver(offset,
view)``, which puts them where they belong (``pwrite`` into the
destination's temp file) before the next chunk arrives. Memory is
therefore ``CHUNK`` per part in flight, whatever the part size and however
many threads the data plane has (a buffer per *thread* grew with every
thread that ever ran a part: up to 128 MiB in a long-lived process).

How the bytes are fetched depends on what the source provider offers:

* range streams (HTTP(S), S3): one GET for the whole part; the worker thread
  sends it and reads the answer's headers, then each chunk of the body is
  received by the process's receiving thread
  (:mod:`tensorstream.providers._http.receiver`, one epoll thread for every
  connection) while the worker sleeps, and the worker delivers it (paced
  link, 25 MB/s per connection, 1 GiB: 1.83 s against 2.40 s with each
  worker receiving its own socket, medians of 8 paired runs). The receiving
  thread does not deliver (``pwrite``) itself: on a machine whose memory
  was full of page cache one ``pwrite`` waited up to 0.17 s for reclaim,
  and every connection waited with it (that version measured 1.3 s one
  run, 4.1 s the next). A body broken part-way
  has its chunk finished by the retrying ranged read (pinned to the version
  the first bytes came from) and the rest of the part re-requested, so a
  part resumes where it broke (never for an object without ETag or
  Last-Modified: its part fails instead);
* blocking reads (local files, Redis): one exact positional read per chunk;
* anything else (fsspec): the provider's async ``readinto`` per chunk, run on
  the copy's event loop.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any

from ..errors import TensorstreamError
from ..layers.pinning import resume_pin
from ..layers.stack import PolicyProvider
from ..providers._http.headers import needs_confirmation
from ..providers._http.receiver import shared_receiving
from ..providers.base import Pin

__all__ = ["CHUNK", "receive_part"]

#: Bytes received per step of a part (one buffer per part in flight). Each
#: step is two thread hand-offs (the receiving thread wakes the worker, which
#: writes the chunk and hands the connection back). 2 MiB halved them (1 GiB
#: from loopback: ~5,000 -> ~3,000 voluntary context switches, user CPU
#: 0.15-0.23 -> 0.11-0.16 s) but the harness measured it slower than 1 MiB in
#: all eight cells of one run (0.60-0.99x, load 5-10) and peak RSS rose from
#: 67 to 100-138 MiB, so it stays 1 MiB (docs/benchmarks.md, "where the time goes").
CHUNK = 1 << 20

#: Free chunk buffers beyond this many are dropped (parts in flight need one each).
_KEEP_FREE = 32
_free: list[memoryview] = []
_free_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A thread of the parent may have held the lock at the fork (it does not exist here)."""
    global _free_lock
    _free_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

Deliver = Callable[[int, memoryview], None]


def _take_chunk() -> memoryview:
    """A free chunk buffer, or a new one: a private anonymous map, page-aligned
    as ``O_DIRECT`` writes of it need (:mod:`.direct`; a ``bytearray``'s data
    starts a few bytes past a page). Private, not ``mmap``'s default shared
    map: shared anonymous memory is shmem, whose first touch of each page
    costs more, and a wide copy touches a fresh buffer per part in flight."""
    with _free_lock:
        if _free:
            return _free.pop()
    return memoryview(mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


def _give_back(buf: memoryview) -> None:
    with _free_lock:
        if len(_free) < _KEEP_FREE:
            _free.append(buf)


def receive_part(src: PolicyProvider, path: str, start: int, end: int, pin: Pin | None,
                 deliver: Deliver, loop: asyncio.AbstractEventLoop) -> bool:
    """Fetch bytes ``[start, end)`` of ``path`` and ``deliver`` them in order.

    Every chunk is delivered whole, exactly once, at its offset. Errors that
    the retry layer could not absorb are raised; bytes already delivered
    stay delivered (the caller discards the part's destination on error).

    Returns whether every byte is known to come from version ``pin``: each
    answer named it (its ETag or Last-Modified equal to the pinned one,
    compared by the data plane), or the provider enforces pinned reads itself.
    If not, the caller compares the source's validators after the copy.
    """
    # A part that fails drops its buffer: an async provider's read cut short by
    # cancellation may still be writing into it from another thread.
    with shared_receiving():
        return _receive(src, path, start, end, pin, deliver, loop, _take_chunk())


def _receive(src: PolicyProvider, path: str, start: int, end: int, pin: Pin | None,
             deliver: Deliver, loop: asyncio.AbstractEventLoop, chunk: memoryview) -> bool:
    caps = src.capabilities
    if caps.range_streams:
        confirmed = _streamed(src, path, start, end, pin, deliver, chunk)
    elif caps.blocking_reads:
        for pos in range(start, end, CHUNK):
            view = chunk[: min(CHUNK, end - pos)]
            src.readinto_blocking(path, pos, view, pin=pin)
            deliver(pos, view)
        confirmed = pin is not None and pin.validated and caps.pinned_reads
    else:
        for pos in range(start, end, CHUNK):
            view = chunk[: min(CHUNK, end - pos)]
            asyncio.run_coroutine_threadsafe(
                src.readinto(path, pos, view, pin=pin), loop).result()
            deliver(pos, view)
        confirmed = pin is not None and pin.validated and caps.pinned_reads
    _give_back(chunk)  # only after a part that ended cleanly: nothing writes into it
    return confirmed


def _streamed(src: PolicyProvider, path: str, start: int, end: int, pin: Pin | None,
              deliver: Deliver, chunk: memoryview) -> bool:
    pos = start
    pinned = pin
    confirmed = pin is not None and pin.validated
    while pos < end:
        body: Any = src.open_range_blocking(path, pos, end, pin=pinned)
        served = getattr(body, "served", None)
        # The plane already refused an answer of another version; one that
        # names no version of its own leaves it unconfirmed.
        confirmed = confirmed and isinstance(served, Pin) and not needs_confirmation(
            pinned, served)
        try:
            while pos < end:
                view = chunk[: min(CHUNK, end - pos)]
                try:
                    body.readinto(view)
                    broken = False
                except TensorstreamError as exc:
                    if not exc.temporary:
                        raise
                    got = int(getattr(exc, "received", 0) or 0)
                    # Never mix versions: what follows must be the version
                    # the first bytes came from, and one that cannot be told
                    # apart from another is never resumed.
                    pinned = resume_pin(pinned, exc)
                    if pinned is None:
                        raise
                    # The retrying ranged read finishes this chunk (it resumes
                    # and gives up by the policy); a new stream takes the rest.
                    src.readinto_blocking(path, pos + got, view[got:], pin=pinned)
                    confirmed = confirmed and src.capabilities.pinned_reads
                    broken = True
                # On this (worker) thread, never on the receiving thread: a
                # pwrite can wait (page reclaim, writeback of the same file),
                # and the receiving thread serves every connection.
                deliver(pos, view)
                pos += len(view)
                if broken:
                    break
        finally:
            body.close()
    return confirmed
