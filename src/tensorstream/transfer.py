"""Transfer engine: split a large read into parts fetched concurrently
straight into slices of the caller's buffer (no intermediate copy).

In-flight memory is the caller's own buffer; nothing else is allocated per
part. The same splitting drives ``cp`` (parts -> writer).
"""

from __future__ import annotations

import asyncio

from .config import TransferConfig
from .providers.base import Provider

__all__ = ["plan_parts", "parallel_readinto"]


def plan_parts(length: int, config: TransferConfig) -> list[tuple[int, int]]:
    """``(start, end)`` slices covering ``[0, length)``.

    Parts are ``part_size`` at most, but a read smaller than
    ``concurrency * part_size`` is split into ``concurrency`` smaller parts
    (down to ``min_part_size``) so every connection stays busy.
    """
    if length <= 0:
        return []
    size = min(config.part_size, max(config.min_part_size, -(-length // config.concurrency)))
    return [(s, min(s + size, length)) for s in range(0, length, size)]


async def parallel_readinto(
    provider: Provider,
    path: str,
    offset: int,
    buffer: memoryview,
    config: TransferConfig,
    *,
    etag: str | None = None,
) -> int:
    """Fill ``buffer`` with ``[offset, offset+len)`` using concurrent ranged reads.

    Fails as a whole: if any part fails, the others are cancelled and the
    first error is raised.
    """
    parts = plan_parts(len(buffer), config)
    if len(parts) <= 1:
        return await provider.readinto(path, offset, buffer, etag=etag) if parts else 0

    queue = iter(parts)

    async def worker() -> None:
        for start, end in queue:
            await provider.readinto(path, offset + start, buffer[start:end], etag=etag)

    workers = [asyncio.create_task(worker()) for _ in range(min(config.concurrency, len(parts)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    return len(buffer)
