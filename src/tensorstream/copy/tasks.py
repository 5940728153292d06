"""The copy's task helpers: stop what was started, and wait until it has.

A copy's tasks write into part buffers and destinations; once a step of the
copy returns or raises, none of them may still be running (a buffer goes
back to the pool, a temp file is removed, a writer is aborted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine, Iterable
from typing import Any

__all__ = ["cancel_and_wait", "gather_or_cancel"]


async def cancel_and_wait(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended. Their outcomes are
    dropped: the caller is raising already, or they had ended."""
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def gather_or_cancel(coros: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Run ``coros`` concurrently; the first failure cancels the others, and
    this raises it only once they all have ended."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        await cancel_and_wait(tasks)
