"""Redis reads on the blocking data path: worker threads, a synchronous
redis-py client (hiredis), no event loop.

The read-ahead engine (:mod:`tensorstream.readahead.ranged`) runs several of these
at once, one per segment; each pipelines ``GETRANGE`` per chunk of the
segment, or one ``MGET`` per run of small whole chunks (:func:`calls`).
Replies arrive as ``bytes`` (redis-py), copied once into the caller's buffer.
Cluster clients stay on the async path (the caller hops to the I/O loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import redis

from ...errors import IncompleteReadError, ObjectChangedError, ProtocolError, TensorstreamError
from ...readahead._memcopy import copy_into
from ..base import Pin
from .errors import REDIS_ERRORS, map_redis_error
from .layout import Layout
from .width import RETRY_IDLE, Width

__all__ = ["BATCH_BYTES", "MGET_KEYS", "MGET_MAX_VALUE", "BlockingRedisReader", "batches",
           "calls", "check_reply", "place"]

#: A read is fetched as pipelines of at most this many bytes, so one huge
#: read never buffers all of its replies at once.
BATCH_BYTES = 8 << 20

#: Bytes per socket read (redis-py's default is 64 KiB): replies here are
#: megabytes, and each read is a trip through the parser.
_READ_SIZE = 1 << 20

#: Runs of whole keys of at most this many bytes are fetched with one ``MGET`` (of at
#: most :data:`MGET_KEYS`) instead of a ``GETRANGE`` each: with 1 KiB chunks, packing,
#: dispatching and parsing a command per chunk was most of a read's work. (An ``MGET``
#: answers whole values: used where the value is small, and a longer one is an error.)
MGET_MAX_VALUE = 64 << 10
MGET_KEYS = 1024

#: (key, start in key, length, position in buffer, the whole key's value)
Entry = tuple[bytes, int, int, int, bool]
Batch = list[Entry]
#: A command of a pipeline: (redis-py method, its arguments, the entries it fetches)
Call = tuple[str, tuple[Any, ...], list[Entry]]


def batches(layout: Layout, offset: int, want: int) -> Iterator[Batch]:
    """The pieces covering ``[offset, offset + want)``, grouped in pipelines of at most
    :data:`BATCH_BYTES` (or one piece), generated one batch at a time: built for a whole
    read up front, a 1 GiB read of 1 KiB chunks held ~320 MB of entries."""
    batch: Batch = []
    pos, filled = 0, 0
    for key, start, n, whole in layout.segments(offset, want):
        if filled and filled + n > BATCH_BYTES:
            yield batch
            batch, filled = [], 0
        batch.append((key, start, n, pos, whole))
        pos += n
        filled += n
    yield batch


def calls(batch: Batch, *, mget: bool) -> list[Call]:
    """The commands fetching ``batch``: a ``GETRANGE`` per piece, but one ``MGET`` per
    run of two or more small whole keys where ``mget``: a manifest's chunks (keys of
    a random generation nobody else writes; a ``to_redis`` key may be written over
    with a value of any size, which an ``MGET`` would receive whole), not on a
    cluster (the keys of one ``MGET`` must share a hash slot; chunk keys spread over
    all)."""
    out: list[Call] = []
    run: list[Entry] = []

    def close_run() -> None:
        if len(run) > 1:
            out.append(("mget", tuple(e[0] for e in run), run[:]))
        else:
            out.extend(_getrange(e) for e in run)
        run.clear()

    for entry in batch:
        if mget and entry[4] and entry[2] <= MGET_MAX_VALUE:
            run.append(entry)
            if len(run) == MGET_KEYS:
                close_run()
        else:
            close_run()
            out.append(_getrange(entry))
    close_run()
    return out


def _getrange(entry: Entry) -> Call:
    key, start, n, _, _ = entry
    return ("getrange", (key, start, start + n - 1), [entry])


def place(layout: Layout, call: Call, reply: Any, buffer: memoryview) -> None:
    """Check the reply to one of :func:`calls`' commands and copy it into ``buffer``."""
    name, _, entries = call
    if name == "mget":
        if not isinstance(reply, list) or len(reply) != len(entries):
            raise ProtocolError(
                f"Redis answered an MGET of {len(entries)} keys with "
                f"{type(reply).__name__}, while {layout.path!r} was being read")
        # (a key that is gone, or holds no string, is answered nil: as good as empty)
        values = [b"" if v is None else v for v in reply]
    else:
        values = [reply]
    for (key, _start, n, pos, _whole), data in zip(entries, values, strict=True):
        check_reply(layout, key, n, data)
        copy_into(buffer[pos : pos + n], data)


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
                planned = calls(batch, mget=layout.kind == "manifest")  # (never a cluster)
                for name, args, _ in planned:
                    getattr(pipe, name)(*args)
                for call, data in zip(planned, pipe.execute(), strict=True):
                    place(layout, call, data, buffer)
                received += sum(e[2] for e in batch)
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
