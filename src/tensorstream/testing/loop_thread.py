"""Test servers that run in their **own thread and event loop**, so the code
under test may use tensorstream's sync or async API against them.

:class:`_LoopThread` is the loop and its daemon thread (start, stop, with every
task still pending cancelled at stop: :func:`cancel_pending`), under
:class:`~.http_server.HTTPTestServer` and :class:`~.http_proxy.HTTPFaultProxy`.
:class:`_StreamServer` adds a listener on ``127.0.0.1`` (``asyncio.start_server``)
and the ``with`` plumbing: the base of :class:`~.tcp_proxy.TCPFaultProxy` and
:class:`~.forward_proxy.ForwardProxy`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ClassVar, TypeVar

__all__ = ["cancel_pending"]

#: Seconds a stopping server lets requests in flight finish before cancelling them.
_SHUTDOWN_TIMEOUT = 2.0


async def cancel_pending() -> None:
    """Cancel every other task of the running loop and wait for them: a handler
    still stalled or paced when a server stops would otherwise be destroyed
    pending when its loop closes ("Task was destroyed but it is pending",
    "Event loop is closed" unraisables that fail a ``-W error`` run)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


class _LoopThread:
    """An event loop in a daemon thread that serves one test server or proxy."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, setup: Callable[[], Coroutine[Any, Any, None]],
              timeout: float = 30.0) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(setup())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self.loop = loop
        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):  # never a server on port 0 handed to a test
            def cancel_setup() -> None:
                for task in asyncio.all_tasks(loop):
                    task.cancel()

            loop.call_soon_threadsafe(cancel_setup)
            self._thread.join(10)
            if not loop.is_running():
                loop.close()
            self.loop = self._thread = None
            raise RuntimeError(f"{self.name} did not start within {timeout:g} s")
        if failure:
            self.stop(None)
            raise RuntimeError(f"{self.name} failed to start: {failure[0]!r}") from failure[0]

    def stop(self, teardown: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
        loop, thread = self.loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            for step in (teardown, cancel_pending):
                if step is None:
                    continue
                try:
                    asyncio.run_coroutine_threadsafe(step(), loop).result(10)
                except Exception:
                    pass
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        if loop is not None and not loop.is_running():
            loop.close()
        self.loop = self._thread = None


_S = TypeVar("_S", bound="_StreamServer")
#: Loop steps allowed from an accepted socket to its connection_made (asyncio takes 2-3).
_SETUP_STEPS = 5


class _StreamServer:
    """A listener on ``127.0.0.1`` (``asyncio.start_server``) served by its own
    :class:`_LoopThread`: the start, stop and ``with`` plumbing the stream-level
    proxies share (:class:`~.tcp_proxy.TCPFaultProxy`, :class:`~.forward_proxy.ForwardProxy`).

    A subclass names its thread, serves each connection in :meth:`_accept`, adds
    the writers of connections it opens to ``_writers`` (cut at stop; each
    client's is there from its first moment), and says how to cut one (:meth:`_abort`)."""

    _thread_name: ClassVar[str]

    def __init__(self, *, port: int = 0) -> None:
        self.port = port
        self._lt = _LoopThread(self._thread_name)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self: _S) -> _S:
        """Start listening (idempotent); returns ``self``."""
        if self._lt.loop is not None:
            return self

        async def setup() -> None:
            self._server = await asyncio.start_server(self._connected, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

        self._lt.start(setup)
        return self

    def stop(self) -> None:
        """Close the listener and every connection (idempotent)."""
        async def teardown() -> None:
            # A connection already accepted is set up over a few loop steps (an
            # accept task, then connection_made). Closed before that, the listener
            # makes asyncio drop it unclosed (its transport cannot attach to a
            # closed server), the client left waiting: let them reach _connected.
            for _ in range(_SETUP_STEPS):
                await asyncio.sleep(0)
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                self._abort(w)

        self._lt.stop(teardown)
        self._server = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        """Cut ``writer``'s connection at :meth:`stop`."""
        writer.transport.abort()

    def _connected(self, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> Coroutine[Any, Any, None]:
        """``start_server``'s callback, called as the connection is made, before its
        task starts: a connection whose task ``stop()`` cancels before its first
        step is still known, and cut (it stayed open, its client waiting)."""
        self._writers.add(writer)
        return self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._accept(reader, writer)
        finally:
            self._writers.discard(writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
