"""The worker threads that serve async callers' blocking requests (``cp``'s parts)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from tensorstream.providers._http import threads


def _wait_for_threads(count: int, timeout: float = 10.0) -> int:
    pool = threads._threads()
    end = time.monotonic() + timeout
    while len(pool._threads) < count and time.monotonic() < end:
        time.sleep(0.01)
    return len(pool._threads)


def test_prestarted_threads_serve_the_requests_that_follow() -> None:
    # In a fresh executor (a process of its own would do too): prestart(n), then
    # n requests at once must run on those n threads, not start n more (each
    # start is a wait on the caller's event loop; a 32-part copy made 67).
    before = threads._executor
    threads._executor = None
    try:
        threads.prestart(8)
        assert _wait_for_threads(8) == 8
        started = threading.Barrier(8, timeout=10)

        async def main() -> None:
            await asyncio.gather(*(threads.in_thread(started.wait) for _ in range(8)))

        asyncio.run(main())
        assert len(threads._threads()._threads) == 8
        threads.prestart(8)  # already there: nothing more
        time.sleep(0.1)
        assert len(threads._threads()._threads) == 8
    finally:
        pool, threads._executor = threads._executor, before
        if pool is not None:
            pool.shutdown(wait=True)


def test_prestart_starts_threads_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each Thread.start waits until its thread has run; while the process is
    # busy that is a switch interval (5 ms) per thread, so one after another
    # 100 threads took 0.65-0.8 s. Here one thread's start is held up: the
    # others must still start (one after another, none would).
    before = threads._executor
    threads._executor = None
    gate = threading.Event()
    calls: list[int] = []
    add = threads._add_thread

    def slow_first(pool: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            gate.wait(10)
        return add(pool)

    monkeypatch.setattr(threads, "_add_thread", slow_first)
    try:
        threads.prestart(8)
        assert _wait_for_threads(7) == 7
        gate.set()
        assert _wait_for_threads(8) == 8
    finally:
        gate.set()
        pool, threads._executor = threads._executor, before
        if pool is not None:
            pool.shutdown(wait=True)


class _Ordered:
    """A lock that records, per thread, which of the watched locks were held
    when it was taken (a lock-order check: two orders can deadlock)."""

    held = threading.local()
    pairs: set[tuple[str, str]] = set()

    def __init__(self, name: str, lock: Any) -> None:
        self.name, self.lock = name, lock

    def __enter__(self) -> Any:
        r = self.lock.__enter__()
        stack = getattr(self.held, "stack", None)
        if stack is None:
            stack = self.held.stack = []
        for outer in stack:
            self.pairs.add((outer, self.name))
        stack.append(self.name)
        return r

    def __exit__(self, *exc: Any) -> Any:
        self.held.stack.remove(self.name)
        return self.lock.__exit__(*exc)

    def acquire(self, *a: Any, **k: Any) -> Any:  # as the exit hook may use it
        return self.lock.acquire(*a, **k)

    def release(self) -> None:
        self.lock.release()


def test_prestart_takes_the_executors_locks_in_submits_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # ThreadPoolExecutor.submit takes the pool's lock, then the global one; a
    # prestart thread that registers its worker in the other order deadlocks
    # against a submit running beside it (a cp hung in CI that way).
    import concurrent.futures.thread as cft

    before = threads._executor
    threads._executor = None
    _Ordered.pairs = set()
    monkeypatch.setattr(cft, "_global_shutdown_lock",
                        _Ordered("global", cft._global_shutdown_lock))
    try:
        pool = threads._threads()
        pool._shutdown_lock = _Ordered("pool", pool._shutdown_lock)  # type: ignore[assignment]
        threads.prestart(8)
        assert _wait_for_threads(8) == 8

        async def main() -> None:
            await asyncio.gather(*(threads.in_thread(lambda: time.sleep(0)) for _ in range(16)))

        asyncio.run(main())
        assert ("pool", "global") in _Ordered.pairs  # submit's order, seen
        assert ("global", "pool") not in _Ordered.pairs, _Ordered.pairs
    finally:
        pool, threads._executor = threads._executor, before
        if pool is not None:
            pool.shutdown(wait=True)
