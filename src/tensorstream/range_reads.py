"""A :class:`~tensorstream.file.StreamReader`'s random access (``read_ranges``),
and the check of a caller's buffer that every read into one makes."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from . import _loop
from .errors import InvalidRangeError
from .layers import timeout as _timeout
from .layers.stack import PolicyProvider
from .providers.base import Pin
from .uri import ParsedURI

__all__ = ["as_byte_view", "read_ranges"]


def as_byte_view(b: Any) -> memoryview:
    """``b`` as a writable, flat view of bytes (TypeError, as io's files, when it is not)."""
    view = memoryview(b)
    if view.readonly:
        raise TypeError("readinto() needs a writable buffer")
    if not view.c_contiguous:  # as io's files: a strided view is refused, never half-filled
        raise TypeError("readinto() needs a C-contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def read_ranges(provider: PolicyProvider, uri: ParsedURI, pin: Pin,
                ranges: Iterable[tuple[int, Any]], *, inline: bool,
                reading: Callable[[], AbstractContextManager[None]]) -> None:
    """Fill each ``(offset, buffer)`` with the bytes of ``uri`` at ``offset``, of the
    version ``pin``: concurrently (``concurrency`` requests at most), or in the
    caller's thread when ``inline`` (each under ``reading()``)."""
    # An offset of 1.5 went out as "bytes=1.5-2.5" (a ProtocolError, or a 416 taken for
    # a changed object); an integer is checked here, once, as seek() checks its own.
    todo = [(operator.index(offset), as_byte_view(b)) for offset, b in ranges]
    for offset, _view in todo:
        if offset < 0:  # as every provider says it (some said "past the end")
            raise InvalidRangeError(f"negative offset {offset}", operation="read_ranges",
                                    path=uri.redacted())
    todo = [(offset, view) for offset, view in todo if len(view)]
    path = uri.path
    if not inline and _loop.in_loop_thread():
        raise RuntimeError("StreamReader.read_ranges was called from tensorstream's own "
                           "I/O thread; use the async provider API there")
    limit = asyncio.Semaphore(max(1, provider.config.transfer.concurrency))

    async def one(offset: int, view: memoryview) -> None:
        async with limit:
            await provider.readinto(path, offset, view, pin=pin)

    async def every() -> None:
        tasks = [asyncio.ensure_future(one(offset, view)) for offset, view in todo]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            # Nothing may write into a caller's buffer once this call has raised.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    with _timeout.operation(provider.config.timeouts):  # one call, one deadline
        if inline:
            with reading():
                for offset, view in todo:
                    provider.readinto_blocking(path, offset, view, pin=pin)
        else:
            _loop.run_sync(every())
