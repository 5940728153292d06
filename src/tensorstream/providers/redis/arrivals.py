"""``timeout_idle`` for redis.asyncio: time without a byte, not time per reply.

redis.asyncio bounds the reading of each whole reply by ``socket_timeout``: a
``GETRANGE`` of 1 MiB from a server sending a steady 1 MB/s failed every
attempt under ``timeout_idle=0.5`` ("Timeout reading from ..."), though bytes
came every millisecond (``cat`` and ``read_range`` of a Redis object on a slow
link; the blocking client's timeout is per receive already). The connections
made here read through :class:`_ArrivalReader`: every arrival moves the reply's
deadline to ``timeout_idle`` from now (redis-py's own hook for relaxing an
active read's timeout, where it has one) and reports progress to the retry
layer's idle watchdog. A server that stops sending still times out after
``timeout_idle``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..base import report_progress

__all__ = ["idle_timed"]

#: Largest piece one arrival is read in (a bulk string is read as it comes).
_PIECE = 1 << 16

_CLASSES: dict[type, type] = {}


def idle_timed(cls: type) -> type:
    """The subclass of redis.asyncio's connection class ``cls`` (plain, TLS)
    whose replies are read under an idle timeout (one subclass per class)."""
    sub = _CLASSES.get(cls)
    if sub is None:
        async def _connect(self: Any) -> None:
            await cls._connect(self)  # type: ignore[attr-defined]
            self._reader = _ArrivalReader(self._reader, self)

        sub = type(f"IdleTimed{cls.__name__}", (cls,), {"_connect": _connect})
        _CLASSES[cls] = sub
    return sub


class _ArrivalReader:
    """A connection's ``asyncio.StreamReader`` that tells of each arrival."""

    def __init__(self, inner: asyncio.StreamReader, conn: Any) -> None:
        self._inner = inner
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _arrived(self, data: bytes) -> bytes:
        if data:
            relax = getattr(self._conn, "_reschedule_active_read_timeout", None)
            if relax is not None:
                relax(self._conn.socket_timeout)
            report_progress()
        return data

    async def read(self, n: int = -1) -> bytes:
        return self._arrived(await self._inner.read(n))

    async def readline(self) -> bytes:
        return self._arrived(await self._inner.readline())

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        return self._arrived(await self._inner.readuntil(separator))

    async def readexactly(self, n: int) -> bytes:
        # In pieces: one wait for a whole bulk string would be a wait per reply again.
        if n <= _PIECE:
            return self._arrived(await self._inner.readexactly(n))
        parts: list[bytes] = []
        left = n
        while left:
            piece = await self._inner.read(min(left, _PIECE))
            if not piece:
                raise asyncio.IncompleteReadError(b"".join(parts), n)
            parts.append(self._arrived(piece))
            left -= len(piece)
        return b"".join(parts)
