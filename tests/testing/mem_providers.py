"""In-memory providers for proving that the conformance suite bites: one that
keeps the contract, and broken ones that each break one part of it.

Copied into a pytester project by ``test_conformance_bites.py``, which runs
the shipped suite against each one. Faults mimic
:class:`tensorstream.testing.backends.Faults`; stalls and trickles stop after
``_FOREVER`` seconds (standing for "never") so that a provider ignoring its
deadlines fails the suite's time bounds without hanging it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any, ClassVar

import tensorstream
from tensorstream import errors
from tensorstream.providers.base import (
    Capabilities,
    ObjectInfo,
    Pin,
    Provider,
    current_deadline,
    report_progress,
)
from tensorstream.testing.conformance import ConformanceTarget

_FOREVER = 4.0
_versions = itertools.count(1)


class MemFaults:
    """The faults of one in-memory store (the subset the suite uses)."""

    def __init__(self, store: MemStore) -> None:
        self._store = store
        self.reset()

    def reset(self) -> None:
        self.stall = 0.0
        self.rate = 0
        self.drop: int | None = None
        self.drop_times: int | None = None
        self.replace: tuple[str, bytes] | None = None
        self.reads = 0

    def supports(self, name: str) -> bool:
        return name in ("latency", "rate_limit", "drop_after", "replace_between_reads")

    def latency(self, seconds: float) -> MemFaults:
        self.stall = min(seconds, _FOREVER)
        return self

    def rate_limit(self, bps: int) -> MemFaults:
        self.rate = bps
        return self

    def drop_after(self, n: int, *, times: int | None = None) -> MemFaults:
        self.drop, self.drop_times = n, times
        return self

    def replace_between_reads(self, key: str, data: bytes) -> MemFaults:
        self.replace = (key, data)
        return self

    def before_read(self, path: str) -> None:
        """Count a read; replace the object just before its second one."""
        self.reads += 1
        if self.replace is not None and self.reads == 2:
            key, data = self.replace
            self._store.put(key, data)

    def cut(self) -> int | None:
        """Bytes after which this read's body breaks (``None``: it does not)."""
        if self.drop is None or self.drop_times == 0:
            return None
        if self.drop_times is not None:
            self.drop_times -= 1
        return self.drop


class MemStore:
    """Objects by path: ``(bytes, etag)``."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.lock = threading.Lock()
        self.faults = MemFaults(self)

    def put(self, key: str, data: bytes) -> None:
        with self.lock:
            self.objects[f"b/{key}"] = (bytes(data), f'"v{next(_versions)}"')

    def get(self, path: str) -> tuple[bytes, str]:
        with self.lock:
            try:
                return self.objects[path]
            except KeyError:
                raise errors.NotFoundError(f"no such object {path}", service="mem") from None


def _step(rate: int) -> int:
    """Bytes per step: 4 KiB, or what a rate limit allows in 50 ms."""
    return 4096 if not rate else max(1, rate // 20)


class MemProvider(Provider):
    """Keeps the contract: pins, deadlines, resume, honest capabilities."""

    service = "mem"
    capabilities: ClassVar[Capabilities] = Capabilities(pinned_reads=True, blocking_reads=True)
    store: ClassVar[MemStore]

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> Provider:
        return cls()

    async def stat(self, path: str) -> ObjectInfo:
        data, etag = self.store.get(path)
        return ObjectInfo(path=path, size=len(data), etag=etag)

    def _version(self, path: str, pin: Pin | None) -> bytes:
        data, etag = self.store.get(path)
        if pin is not None:
            pin.check(Pin(size=len(data), etag=etag), service="mem", path=path)
        return data

    def _slice(self, data: bytes, offset: int, n: int) -> bytes:
        if offset < 0 or offset + n > len(data):
            raise errors.InvalidRangeError(f"[{offset}, {offset + n}) past {len(data)}")
        return data[offset : offset + n]

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        faults = self.store.faults
        faults.before_read(path)
        if faults.stall:
            await asyncio.sleep(faults.stall)
        src = self._slice(self._version(path, pin), offset, len(buffer))
        cut = faults.cut()
        started = time.monotonic()
        step = _step(faults.rate)
        for pos in range(0, len(src), step):
            if cut is not None and pos >= cut:
                raise self._broken(pos, path, pin)
            if faults.rate and time.monotonic() - started < _FOREVER:
                await asyncio.sleep(step / faults.rate)
            buffer[pos : pos + step] = src[pos : pos + step]
            report_progress()
        return len(buffer)

    def readinto_blocking(self, path: str, offset: int, buffer: memoryview, *,
                          pin: Pin | None = None) -> int:
        faults = self.store.faults
        faults.before_read(path)
        deadline = current_deadline()
        if faults.stall:
            bound = deadline.wait_bound() if deadline is not None else None
            time.sleep(faults.stall if bound is None else min(faults.stall, bound))
            if bound is not None and bound < faults.stall:
                raise errors.StorageTimeoutError("stalled", service="mem")
        src = self._slice(self._version(path, pin), offset, len(buffer))
        cut = faults.cut()
        started = time.monotonic()
        step = _step(faults.rate)
        for pos in range(0, len(src), step):
            if deadline is not None and self.honours_deadlines and deadline.expired():
                raise deadline.error(pos, service="mem", path=path)
            if cut is not None and pos >= cut:
                raise self._broken(pos, path, pin)
            if faults.rate and time.monotonic() - started < _FOREVER:
                time.sleep(step / faults.rate)
            buffer[pos : pos + step] = src[pos : pos + step]
        return len(buffer)

    honours_deadlines: ClassVar[bool] = True

    def _broken(self, received: int, path: str, pin: Pin | None) -> errors.IncompleteReadError:
        return errors.IncompleteReadError(f"cut after {received} bytes", received=received,
                                          service="mem")


class IgnoresPin(MemProvider):
    """Declares pinned reads but serves whatever version is there now."""

    def _version(self, path: str, pin: Pin | None) -> bytes:
        return self.store.get(path)[0]


class StallsBlocking(MemProvider):
    """Its blocking path waits and trickles past every deadline."""

    honours_deadlines = False

    def readinto_blocking(self, path: str, offset: int, buffer: memoryview, *,
                          pin: Pin | None = None) -> int:
        if self.store.faults.stall:
            time.sleep(self.store.faults.stall)
            self.store.faults.stall = 0.0
        return super().readinto_blocking(path, offset, buffer, pin=pin)


class Misreports(MemProvider):
    """Declares list and delete without implementing them."""

    capabilities = Capabilities(pinned_reads=True, blocking_reads=True, list=True, delete=True)


class LiesAboutReceived(MemProvider):
    """Counts more bytes as received than it delivered."""

    def _broken(self, received: int, path: str, pin: Pin | None) -> errors.IncompleteReadError:
        return errors.IncompleteReadError("cut", received=received + 4096, service="mem")


def target_for(scheme: str, cls: type[MemProvider]) -> ConformanceTarget:
    """Register a fresh store under ``scheme`` served by ``cls``; its target."""
    store = MemStore()
    provider = type(cls.__name__, (cls,), {"store": store, "schemes": (scheme,)})
    tensorstream.register(scheme, provider, replace=True)
    return ConformanceTarget(uri=lambda key: f"{scheme}://b/{key}", put=store.put,
                             faults=store.faults)
