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
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._log_redaction import scrub_chain
from .errors import TensorstreamError

__all__ = ["get_loop", "run_sync", "in_loop_thread"]

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


@atexit.register
def _stop_at_exit() -> None:
    """Stop the I/O loop before interpreter teardown.

    Objects finalised after this (an unclosed reader or writer) must not wait
    on a daemon thread that can no longer run: that hangs the exit forever.
    """
    global _shut_down
    _shut_down = True
    loop, thread = _loop, _thread
    if loop is not None and _pid == os.getpid() and loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)


def is_shut_down() -> bool:
    """True once the interpreter is exiting and the I/O loop has been stopped."""
    return _shut_down


def loop_pid() -> int | None:
    """PID of the process that owns the current loop (None before first use)."""
    return _pid


def in_loop_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


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
    future = asyncio.run_coroutine_threadsafe(coro, get_loop())
    try:
        return future.result(timeout)
    except BaseException as exc:
        future.cancel()
        if isinstance(exc, TensorstreamError):
            scrub_chain(exc)  # also errors that did not pass a provider (see errors.py)
        raise
