"""Receiving one part of a source object, chunk by chunk, in a worker thread.

``cp`` runs each part as one call of :func:`receive_part` on the data plane's
worker threads (:func:`tensorstream.providers._http.range_get.in_thread`):
the part's bytes arrive in a small buffer owned by the thread (``CHUNK``
bytes, reused for every chunk, so it stays in cache and is never faulted
in again) and are handed to ``deliver(offset, view)``, which puts them
where they belong (``pwrite`` into the destination's temp file) before the
next chunk arrives. Memory is therefore ``CHUNK`` per part in flight,
whatever the part size.

How the bytes are fetched depends on what the source provider offers:

* range streams (HTTP(S), S3): one GET for the whole part, received with
  ``recv_into``; a body broken part-way has its chunk finished by the
  retrying ranged read (pinned to the ETag) and the rest of the part
  re-requested, so a part resumes where it broke;
* blocking reads (local files, Redis): one exact positional read per chunk;
* anything else (fsspec): the provider's async ``readinto`` per chunk, run on
  the copy's event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ..errors import TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers._http.headers import etags_match

__all__ = ["CHUNK", "receive_part"]

#: Bytes received per step of a part (one buffer per worker thread).
CHUNK = 1 << 20

_local = threading.local()

Deliver = Callable[[int, memoryview], None]


def _chunk_buffer() -> memoryview:
    buf = getattr(_local, "chunk", None)
    if buf is None:
        buf = _local.chunk = memoryview(bytearray(CHUNK))
    return buf


def receive_part(src: PolicyProvider, path: str, start: int, end: int, etag: str | None,
                 deliver: Deliver, loop: asyncio.AbstractEventLoop) -> bool:
    """Fetch bytes ``[start, end)`` of ``path`` and ``deliver`` them in order.

    Every chunk is delivered whole, exactly once, at its offset. Errors that
    the retry layer could not absorb are raised; bytes already delivered
    stay delivered (the caller discards the part's destination on error).

    Returns whether every byte is known to come from version ``etag``: each
    answer named it (its ``ETag`` equal to the pinned one, compared by the data
    plane), or the provider enforces pinned reads itself. If not, the caller
    compares the source's validators after the copy.
    """
    chunk = _chunk_buffer()
    caps = src.capabilities
    if caps.range_streams:
        return _streamed(src, path, start, end, etag, deliver, chunk)
    if caps.blocking_reads:
        for pos in range(start, end, CHUNK):
            view = chunk[: min(CHUNK, end - pos)]
            src.readinto_blocking(path, pos, view, etag=etag)
            deliver(pos, view)
    else:
        for pos in range(start, end, CHUNK):
            view = chunk[: min(CHUNK, end - pos)]
            asyncio.run_coroutine_threadsafe(
                src.readinto(path, pos, view, etag=etag), loop).result()
            deliver(pos, view)
    return etag is not None and caps.pinned_reads


def _streamed(src: PolicyProvider, path: str, start: int, end: int, etag: str | None,
              deliver: Deliver, chunk: memoryview) -> bool:
    pos = start
    pinned = etag
    confirmed = etag is not None
    while pos < end:
        body: Any = src.open_range_blocking(path, pos, end, etag=pinned)
        served = getattr(body, "etag", None)
        # The plane already refused an answer whose ETag differs from the
        # pinned one; one without an ETag leaves the version unconfirmed.
        confirmed = confirmed and served is not None and etags_match(served, etag or "")
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
                    # the first bytes came from.
                    pinned = pinned or getattr(exc, "etag", None)
                    # The retrying ranged read finishes this chunk (it resumes
                    # and gives up by the policy); a new stream takes the rest.
                    src.readinto_blocking(path, pos + got, view[got:], etag=pinned)
                    confirmed = confirmed and src.capabilities.pinned_reads
                    broken = True
                deliver(pos, view)
                pos += len(view)
                if broken:
                    break
        finally:
            body.close()
    return confirmed
