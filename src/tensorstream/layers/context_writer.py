"""The writer :class:`~tensorstream.layers.stack.PolicyProvider` hands out: the
provider's writer, its errors given context."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ..errors import TensorstreamError
from ..providers.base import Writer

if TYPE_CHECKING:  # pragma: no cover
    from .stack import PolicyProvider

__all__ = ["ContextWriter"]


class ContextWriter(Writer):
    """Adds error context to a provider's writer; forwards everything."""

    def __init__(self, inner: Writer, owner: PolicyProvider, path: str) -> None:
        self.inner = inner
        self.owner = owner
        self.path = path

    async def _wrap(self, op: str, aw: Awaitable[None]) -> None:
        try:
            await aw
        except TensorstreamError as exc:
            self.owner._add_context(exc, op, self.path)
            raise

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self._wrap("write", self.inner.write(data))

    async def commit(self) -> None:
        await self._wrap("commit", self.inner.commit())

    def part_size_for(self, total: int, wanted: int) -> int | None:
        return self.inner.part_size_for(total, wanted)

    @property
    def wants_sha256(self) -> bool:  # type: ignore[override]
        return self.inner.wants_sha256

    async def write_part(self, index: int, data: memoryview, *, md5: bytes) -> None:
        await self._wrap("write", self.inner.write_part(index, data, md5=md5))

    async def commit_parts(self, count: int, *, sha256: str | None = None) -> None:
        await self._wrap("commit", self.inner.commit_parts(count, sha256=sha256))

    async def abort(self) -> None:
        # Abort must run even when the task is being cancelled.
        await asyncio.shield(self._wrap("abort", self.inner.abort()))
