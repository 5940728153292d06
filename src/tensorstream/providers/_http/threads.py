"""The async side of the HTTP(S) data plane, derived: the same blocking
requests on worker threads, cancellable (see :mod:`.range_get`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from .connections import Cancel, current

__all__ = ["MAX_THREADS", "in_thread", "prestart"]

#: Threads that serve async callers' blocking requests (created on demand; one
#: per request in flight, so this bounds a process's concurrent async reads).
MAX_THREADS = 128
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_pid = 0
_executor_lock = threading.Lock()

T = TypeVar("T")


def _threads() -> concurrent.futures.ThreadPoolExecutor:
    global _executor, _executor_pid
    with _executor_lock:
        if _executor is None or _executor_pid != os.getpid():
            # asyncio's default executor has min(32, cpus + 4) threads: it would
            # cap a cp or a gather of reads at 6 connections on a 2-core machine.
            _executor = concurrent.futures.ThreadPoolExecutor(
                MAX_THREADS, thread_name_prefix="tensorstream-http")
            _executor_pid = os.getpid()
        return _executor


def _run_cancellable(cancel: Cancel, fn: Callable[[], T]) -> T:
    current.cancel = cancel
    try:
        return fn()
    finally:
        current.cancel = None


async def in_thread(fn: Callable[[], T]) -> T:
    """Run the blocking ``fn()`` on a worker thread for an async caller.

    This is how the async provider methods of HTTP(S) and S3 are derived from
    the one blocking data plane (and how ``cp`` runs its parts). Every request
    ``fn`` makes on this plane, through any layer, is tied to the call: if the
    caller is cancelled, the request's connection is shut down, later requests
    fail with :class:`Cancelled`, and the call waits for the thread to stop,
    so no thread writes into a caller's buffer after this returns or raises.
    """
    cancel = Cancel()
    # In the caller's context: the deadlines of the operation (set by the
    # timeout layer) reach the thread, and its progress reports reach the layer.
    context = contextvars.copy_context()
    future = asyncio.get_running_loop().run_in_executor(
        _threads(), context.run, _run_cancellable, cancel, fn)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel.cancel()
        with contextlib.suppress(BaseException):
            await future
        raise


def prestart(count: int) -> None:
    """Have up to ``count`` worker threads running soon, without waiting.

    The executor starts a thread inside ``submit`` when none is idle, and
    ``Thread.start`` waits until the new thread runs: on a busy machine that
    is milliseconds per thread, spent on the caller's event loop, one thread
    after another. A caller that knows it will want ``count`` requests in
    flight (``cp``) calls this first; a helper thread starts them while the
    caller lists or stats its sources. Threads only: no task is queued, so
    requests submitted meanwhile are never held up and no extra thread is
    made (best effort: an executor without the hook is left as it is)."""
    pool = _threads()
    adjust = getattr(pool, "_adjust_thread_count", None)
    lock = getattr(pool, "_shutdown_lock", None)
    idle = getattr(pool, "_idle_semaphore", None)
    if adjust is None or lock is None or idle is None:
        return
    want = min(count, MAX_THREADS)

    def start() -> None:
        # The executor's own step, under its own lock (as submit calls it). It
        # starts a thread only when it cannot take a permit of the executor's
        # idle count, so the permits are set aside for it; the new thread,
        # waiting for work, is idle, and gets a permit of its own. Without
        # that, every submit while all threads were busy or never used
        # started yet another thread (a 32-part copy made 67, each start a
        # wait on the caller's event loop).
        for _ in range(want):
            with lock:
                threads = len(pool._threads)
                if getattr(pool, "_shutdown", False) or threads >= want:
                    return
                held = 0
                while idle.acquire(timeout=0):
                    held += 1
                try:
                    adjust()
                except RuntimeError:  # the interpreter is shutting down
                    return
                finally:
                    started = len(pool._threads) - threads
                    for _ in range(held + started):
                        idle.release()

    threading.Thread(target=start, name="tensorstream-prestart", daemon=True).start()
