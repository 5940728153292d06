"""The requests a test server is answering now, so that a test's end can end them.

The plugin's servers live for the whole session, one test after another. A
request still waiting out ``latency`` or a stall when its test ended (the
client gave up on it: a timeout test) went on afterwards, under the next
test's faults: it took that test's scripted status, drop or hook, and showed
up in its ``requests``; a Redis command held back by the TCP proxy ran during
the next test. The HTTP test server, the HTTP fault proxy (their handlers) and
the TCP fault proxy (a connection's held-back bytes) track that work here, and
the backends cancel it when their test ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["InFlight"]


class InFlight:
    """The tasks of the requests being answered on one server's event loop."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Around a request handler's body, on the server's loop."""
        task = asyncio.current_task()
        if task is None:  # not in a task: nothing to cancel later
            yield
            return
        self._loop = task.get_loop()
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    def cancel(self, timeout: float = 5.0) -> None:
        """Cancel every request being answered now and wait for them (up to
        ``timeout`` seconds); their clients see the connection closed. Called
        from any thread but the server's; does nothing when none is in flight."""
        loop = self._loop
        if not self._tasks or loop is None or loop.is_closed() or not loop.is_running():
            return

        async def cancel_all() -> None:
            tasks = [t for t in self._tasks if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout + 1)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # the server is stopping: its own stop cancels what is left
