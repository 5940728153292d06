"""One background event loop per process that runs the async providers
behind the synchronous API (``tensorstream.open`` and friends).

* Calling the sync API from the loop thread itself raises at once instead
  of deadlocking.
* After ``os.fork()`` the child gets a fresh loop (the parent's thread does
  not exist there); providers created in the parent must not be reused.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import select
import selectors
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from ._log_redaction import scrub_chain
from .errors import TensorstreamError

__all__ = ["abort_at_exit", "after_main_returned", "get_loop", "in_loop_thread",
           "main_thread_returned", "run_sync", "run_soon"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None
_shut_down = False


def _start() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _pid
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=run, name="tensorstream-io", daemon=True)
    thread.start()
    ready.wait()
    _loop, _thread, _pid = loop, thread, os.getpid()
    return loop


def get_loop() -> asyncio.AbstractEventLoop:
    """The process's I/O loop, started on first use (and again after fork)."""
    loop = _loop
    if loop is not None and _pid == os.getpid() and loop.is_running():
        return loop
    with _lock:
        if _loop is not None and _pid == os.getpid() and _loop.is_running():
            return _loop
        return _start()


#: Writers whose leftovers would outlive the process (an S3 multipart upload is
#: billed until a lifecycle rule removes it; a temp file stays on disk). Weak:
#: a writer that is garbage-collected or finished drops out by itself.
_exit_aborts: weakref.WeakSet[Any] = weakref.WeakSet()
#: How long the exit may wait for those aborts, all together (seconds).
EXIT_ABORT_TIMEOUT = 15.0


def abort_at_exit(writer: Any) -> None:
    """Have ``await writer.abort()`` run at interpreter exit if it is still open
    then, while the I/O loop can still run it (``abort`` must be idempotent and
    do nothing after a commit)."""
    _exit_aborts.add(writer)


async def _abort_all(writers: list[Any]) -> None:
    await asyncio.gather(*(w.abort() for w in writers), return_exceptions=True)


@atexit.register
def _stop_at_exit() -> None:
    """Abort writers left open, then stop the I/O loop before interpreter teardown.

    The aborts run first, on the still-running loop: once it stops, nothing
    can reach S3 any more. Objects finalised after this (an unclosed reader or
    writer) must not wait on a daemon thread that can no longer run: that
    hangs the exit forever.
    """
    global _shut_down
    loop, thread = _loop, _thread
    alive = loop is not None and _pid == os.getpid() and loop.is_running()
    pending = list(_exit_aborts)
    if alive and pending and not in_loop_thread():
        assert loop is not None
        future = asyncio.run_coroutine_threadsafe(_abort_all(pending), loop)
        try:
            future.result(EXIT_ABORT_TIMEOUT)
        except BaseException:  # exiting anyway; each writer logs its own failure
            future.cancel()
    _shut_down = True
    if loop is not None and _pid == os.getpid() and loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)


def _unshare_selector(loop: asyncio.AbstractEventLoop | None) -> None:
    """Point a loop inherited through ``fork()`` at an epoll instance of the
    child's own. The epoll instance is shared with the parent: a child closing
    the parent's transports (the garbage collector at its exit: redis-py
    closes its connections) removed the parent's sockets from the parent's
    loop, whose reads then waited for an answer that never came."""
    selector: Any = getattr(loop, "_selector", None)  # asyncio's selector event loops
    epoll: Any = getattr(selectors, "EpollSelector", None)  # Linux only
    if epoll is not None and isinstance(selector, epoll):
        fresh = select.epoll()
        try:
            os.dup2(fresh.fileno(), selector.fileno(), inheritable=False)
        finally:
            fresh.close()


def _after_fork_in_child() -> None:
    global _lock
    _unshare_selector(_loop)
    # A thread of the parent starting the loop may have held it (it does not exist here).
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def is_shut_down() -> bool:
    """True once the interpreter is exiting and the I/O loop has been stopped."""
    return _shut_down


def loop_pid() -> int | None:
    """PID of the process that owns the current loop (None before first use)."""
    return _pid


def in_loop_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


#: Calls :func:`run_soon` started and that have not ended (a task only the loop
#: refers to weakly may be collected before it ends).
_soon: set[asyncio.Task[Any]] = set()


def run_soon(coro: Coroutine[Any, Any, Any]) -> None:
    """Start ``coro`` on the I/O loop from the loop's own thread, without waiting
    for it (which would deadlock): a close that the garbage collector's finalizer
    of a dropped reader makes there. A failure is logged at DEBUG."""
    task = get_loop().create_task(coro)
    _soon.add(task)
    task.add_done_callback(_ended_soon)


def _ended_soon(task: asyncio.Task[Any]) -> None:
    _soon.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("tensorstream").debug("a close run on the I/O loop failed",
                                                exc_info=task.exception())


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the I/O loop and wait for its result.

    Raises ``RuntimeError`` immediately when called from the I/O loop thread
    (that would deadlock). It is fine to call from a thread that runs its
    own event loop: the work happens on tensorstream's loop, not the caller's.
    """
    if _shut_down:
        coro.close()
        raise RuntimeError("tensorstream's I/O loop has stopped: the interpreter is exiting")
    if in_loop_thread():
        coro.close()
        raise RuntimeError(
            "tensorstream's synchronous API was called from its own I/O thread; "
            "use the async API (await tensorstream.read_range/stat/get_provider) instead"
        )
    loop = get_loop()
    call = _Call(coro)
    future: concurrent.futures.Future[Any] | None = None
    try:
        future = asyncio.run_coroutine_threadsafe(call.run(), loop)
        return cast("T", future.result(timeout))
    except BaseException as exc:
        if future is not None:
            future.cancel()
        # An interrupt (KeyboardInterrupt, a signal handler's exception; also one
        # that lands while the call is being handed to the loop) or the timeout left
        # the coroutine running there: it wrote into the caller's buffers after this
        # call had raised (read_ranges). A call that raised has stopped.
        call.stop(loop, cancel=future is None)
        if isinstance(exc, TensorstreamError):
            scrub_chain(exc)  # also errors that did not pass a provider (see errors.py)
        elif isinstance(exc, RuntimeError) and main_thread_returned():
            raise RuntimeError(after_main_returned()) from exc
        raise


def main_thread_returned() -> bool:
    """Whether the main thread has returned and Python's exit has begun, while
    this thread (not a daemon: Python waits for it) still runs."""
    # (threading marks the exit's start before it stops the thread pools, which is
    # before the main thread counts as stopped; the flag is private, hence the fallback)
    return (bool(getattr(threading, "_SHUTTING_DOWN", False))
            or not threading.main_thread().is_alive())


def after_main_returned() -> str:
    """Why work refused once the main thread returned failed, and what to do."""
    return (f"tensorstream cannot start new work in thread {threading.current_thread().name!r}: "
            "the main thread has returned, and once Python's exit begins its thread pools "
            "(concurrent.futures) take no new tasks; have the main thread wait for this "
            "thread (thread.join()) before it returns")


class _Call:
    """A coroutine run for :func:`run_sync`, which can tell whether it started."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._lock = threading.Lock()
        self._task: asyncio.Task[Any] | None = None  # set once it runs
        self._abandoned = False
        self._done = threading.Event()

    async def run(self) -> Any:
        with self._lock:
            if self._abandoned:  # the caller gave up before the loop got to it
                raise asyncio.CancelledError
            self._task = asyncio.current_task()
        try:
            return await self._coro
        finally:
            self._done.set()

    def stop(self, loop: asyncio.AbstractEventLoop, *, cancel: bool) -> None:
        """Return once the coroutine has ended, or never will start (it is then
        closed here); ``cancel``: cancel it first (its future, which does, was
        never made). Never a second cancel: that cut short the clean-up of the
        first (a request's wait for its thread to stop receiving)."""
        with self._lock:
            self._abandoned = True
            task = self._task
        if self._done.is_set():  # (an error of its own: it has ended)
            return
        if task is None:
            self._coro.close()
            return
        if cancel:
            loop.call_soon_threadsafe(task.cancel)  # (ended already: a no-op)
        # (A second interrupt ends this wait; a stopped loop never finishes it.)
        while not self._done.wait(0.1):
            if not loop.is_running():
                return
