"""Redis reads on the blocking data path: worker threads, a synchronous
redis-py client (hiredis), no event loop.

The read-ahead engine (:mod:`tensorstream.readahead.ranged`) runs several of these
at once, one per segment; each pipelines ``GETRANGE`` per chunk of the
segment. Replies arrive as ``bytes`` (redis-py), copied once into the
caller's buffer. Cluster clients stay on the async path (the caller hops to
the I/O loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

from ...errors import IncompleteReadError, ObjectChangedError, ProtocolError, TensorstreamError
from ...readahead._memcopy import copy_into
from ..base import Pin
from .errors import REDIS_ERRORS, map_redis_error
from .layout import Layout
from .width import RETRY_IDLE, Width

__all__ = ["BATCH_BYTES", "BlockingRedisReader", "batches", "check_reply"]

#: A read is fetched as pipelines of at most this many bytes, so one huge
#: read never buffers all of its replies at once.
BATCH_BYTES = 8 << 20

#: Bytes per socket read (redis-py's default is 64 KiB): replies here are
#: megabytes, and each read is a trip through the parser.
_READ_SIZE = 1 << 20

Batch = list[tuple[bytes, int, int, int]]  # (key, start in key, length, position in buffer)


def batches(layout: Layout, offset: int, want: int) -> list[Batch]:
    """``GETRANGE`` calls covering ``[offset, offset + want)``, grouped in pipelines."""
    out: list[Batch] = [[]]
    pos, filled = 0, 0
    for key, start, n in layout.segments(offset, want):
        if filled and filled + n > BATCH_BYTES:
            out.append([])
            filled = 0
        out[-1].append((key, start, n, pos))
        pos += n
        filled += n
    return out


def check_reply(layout: Layout, key: bytes, n: int, data: bytes) -> None:
    """Raise :class:`ObjectChangedError` unless a ``GETRANGE`` reply has ``n`` bytes."""
    if not isinstance(data, bytes):  # a server answering an integer, an array...
        raise ProtocolError(
            f"Redis answered GETRANGE of key {key.decode(errors='replace')!r} with a "
            f"{type(data).__name__}, not bytes, while {layout.path!r} was being read")
    if len(data) != n:
        # A chunk of the pinned generation is gone: overwritten or deleted.
        raise ObjectChangedError(
            f"Redis key {key.decode(errors='replace')!r} changed or disappeared (evicted at "
            f"maxmemory, expired, deleted or overwritten) while {layout.path!r} was being "
            f"read (expected {n} bytes, got {len(data)})"
        )


class BlockingRedisReader:
    """A thread-safe synchronous client for ranged reads of one database."""

    def __init__(self, client_kwargs: dict[str, Any], db: int, who: str,
                 secrets: tuple[str, ...] = (), *, width: Width | None = None,
                 drop_idle: Callable[[], None] | None = None) -> None:
        self._width = width or Width()
        #: closes the idle connections of every client of the provider
        self._drop_idle = drop_idle or self.drop_idle
        self._kwargs = client_kwargs
        self._db = db
        self._who = who
        self._secrets = secrets
        self._lock = threading.Lock()
        self._client: redis.Redis | None = None

    def _get(self) -> redis.Redis:
        with self._lock:
            if self._client is None:  # redis-py's pool itself resets after fork
                self._client = redis.Redis(db=self._db, socket_read_size=_READ_SIZE, **self._kwargs)
            return self._client

    def readinto(self, layout: Layout, offset: int, buffer: memoryview) -> int:
        """Fill ``buffer`` from ``offset`` of ``layout`` or raise (``received`` set
        on a temporary failure after whole pipelines arrived), within the width
        the server allows (:mod:`.width`)."""
        idle_dropped = False
        while True:
            with self._width.slot_blocking():
                try:
                    n = self._readinto(layout, offset, buffer)
                    self._width.went_well()
                    return n
                except TensorstreamError as err:
                    step = self._width.after_failure(err, idle_dropped=idle_dropped)
            if step == RETRY_IDLE:
                self._drop_idle()
                idle_dropped = True

    def drop_idle(self) -> None:
        """Close this client's idle connections."""
        with self._lock:
            client = self._client
        if client is not None:
            client.connection_pool.disconnect(inuse_connections=False)

    def _readinto(self, layout: Layout, offset: int, buffer: memoryview) -> int:
        received = 0
        client = self._get()
        try:
            for batch in batches(layout, offset, len(buffer)):
                pipe = client.pipeline(transaction=False)
                for key, start, n, _ in batch:
                    pipe.getrange(key, start, start + n - 1)
                for (key, _start, n, pos), data in zip(batch, pipe.execute(), strict=True):
                    check_reply(layout, key, n, data)
                    copy_into(buffer[pos : pos + n], data)
                received += sum(n for _, _, n, _ in batch)
        except REDIS_ERRORS as exc:
            err = map_redis_error(exc, who=self._who, secrets=self._secrets)
            if err.temporary and received:
                broken = IncompleteReadError(
                    f"Redis read broken after {received} bytes: {err.message}", received=received)
                # The version these bytes came from: a manifest's generation.
                broken.served = Pin(size=layout.size,
                                    etag=layout.etag if layout.kind == "manifest" else None)
                raise broken from exc
            raise err from exc
        return len(buffer)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
