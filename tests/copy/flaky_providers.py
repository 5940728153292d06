"""Small real providers for the local-destination copy tests, registered through the public
``tensorstream.register``: ``flakytest://`` (reads fail with a temporary error from a given
offset on, the way a network source is cut off mid-copy), ``changingtest://`` (no ETag, a
Last-Modified that moves), ``datedtest://`` (listed objects of a date the test gives),
``gatedtest://`` (reads wait for the test) and ``slowtest://``
(50 ms reads, counted in flight). The ``flaky`` fixture (conftest.py) resets them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import ClassVar

import tensorstream
from memory_provider import MemReads
from tensorstream.errors import ServiceUnavailableError
from tensorstream.providers.base import Capabilities, ObjectInfo, Pin

PART = 64 << 10


class FlakyProvider(MemReads):
    """Read-only in-memory objects; reads at or past ``fail_from`` raise a temporary error."""

    schemes = ("flakytest",)
    service = "flakytest"
    capabilities: ClassVar[Capabilities] = Capabilities()
    store: ClassVar[dict[str, bytes]] = {}
    fail_from: ClassVar[int | None] = None
    #: Only these objects fail (empty: every object).
    fail_only: ClassVar[set[str]] = set()

    def before_read(self, path: str, end: int) -> None:
        failing = not self.fail_only or path in self.fail_only
        if failing and self.fail_from is not None and end > self.fail_from:
            raise ServiceUnavailableError("cut off (test)")


tensorstream.register("flakytest", FlakyProvider, replace=True)


def names_in(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


class ChangingProvider(FlakyProvider):
    """Objects without an ETag (Last-Modified only, like many HTTP servers) whose
    Last-Modified moves once ``change_after`` reads were served."""

    schemes = ("changingtest",)
    service = "changingtest"
    change_after: ClassVar[int] = 1 << 30
    reads: ClassVar[int] = 0

    async def stat(self, path: str) -> ObjectInfo:
        info = await super().stat(path)
        changed = self.reads >= self.change_after
        mtime = datetime(2026, 1, 2 if changed else 1, tzinfo=timezone.utc)
        return ObjectInfo(path, info.size, None, mtime)

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        type(self).reads += 1
        return await super().readinto(path, offset, buffer, pin=pin)


tensorstream.register("changingtest", ChangingProvider, replace=True)


class DatedProvider(FlakyProvider):
    """Listed objects (no ETag) all dated ``mtime``: a source dated past what a file
    can hold (a server's Last-Modified of the year 3000)."""

    schemes = ("datedtest",)
    service = "datedtest"
    capabilities: ClassVar[Capabilities] = Capabilities(list=True)
    store: ClassVar[dict[str, bytes]] = {}
    mtime: ClassVar[datetime] = datetime(2026, 1, 1, tzinfo=timezone.utc)

    async def stat(self, path: str) -> ObjectInfo:
        info = await super().stat(path)
        return ObjectInfo(path, info.size, None, self.mtime)

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        for path in sorted(p for p in self.store if p.startswith(prefix)):
            yield await self.stat(path)


tensorstream.register("datedtest", DatedProvider, replace=True)


class GatedProvider(FlakyProvider):
    """Objects whose reads past ``gate_at`` wait until the test opens ``gate``."""

    schemes = ("gatedtest",)
    service = "gatedtest"
    gate_at: ClassVar[int] = 0
    gate: ClassVar[threading.Event] = threading.Event()
    waiting: ClassVar[threading.Event] = threading.Event()

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        if offset + len(buffer) > self.gate_at:
            self.waiting.set()
            await asyncio.to_thread(self.gate.wait, 30)
        return await super().readinto(path, offset, buffer, pin=pin)


tensorstream.register("gatedtest", GatedProvider, replace=True)


class SlowProvider(FlakyProvider):
    """Every read takes 50 ms (a capped link); counts the reads in flight."""

    schemes = ("slowtest",)
    service = "slowtest"
    in_flight: ClassVar[int] = 0
    most: ClassVar[int] = 0

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        cls = type(self)
        cls.in_flight += 1
        cls.most = max(cls.most, cls.in_flight)
        try:
            await asyncio.sleep(0.05)
            return await super().readinto(path, offset, buffer, pin=pin)
        finally:
            cls.in_flight -= 1


tensorstream.register("slowtest", SlowProvider, replace=True)
