"""Tasks of one copy's parts run together: the first failure stops the rest.

:func:`run_all` cancels the others at once (requests that change nothing: HEADs).
:func:`settled` is for requests S3 acts on (``UploadPartCopy``): the parts not yet sent
are not sent, and those S3 already has are waited for before the failure is raised, so
that an abort of the upload comes after them (S3 goes on with a request it has, whether
its client hung up or not; a part that lands after the abort is left behind).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["SETTLE", "drain", "run_all", "settled"]

#: Seconds a failed or cancelled multipart copy waits for its parts already sent, before
#: it aborts the upload.
SETTLE = 30.0


async def run_all(coros: Any) -> list[Any]:
    """Run ``coros`` concurrently; the first failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def settled(tasks: list[asyncio.Future[None]], stop: list[bool]) -> None:
    """Wait for every part; at the first failure, or a cancellation, ``stop`` is set (no
    part not yet sent is sent) and the parts S3 already has are waited for (up to
    :data:`SETTLE` s) before the failure is raised: S3 goes on copying a part whose
    request it has, cancelled or not here, and one that lands after the upload's abort is
    left behind (AWS: "abort again")."""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        stop[0] = True
        await drain(tasks)
        raise
    failed = [t for t in tasks if t in done and not t.cancelled() and t.exception()]
    if failed:
        stop[0] = True
        await drain(tasks)
        raise failed[0].exception()  # type: ignore[misc]


async def drain(tasks: list[asyncio.Future[None]]) -> None:
    """Wait for the parts still running (those sent to S3), then cancel what is left."""
    pending = [t for t in tasks if not t.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=SETTLE)
        for t in late:
            t.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    for t in tasks:  # (their errors are the first one's consequences: retrieved, not raised)
        if t.done() and not t.cancelled():
            t.exception()
