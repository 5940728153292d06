"""The async side of the HTTP(S) data plane, derived: the same blocking
requests on worker threads, cancellable (see :mod:`.range_get`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

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
        # Until the thread has stopped, however often this is cancelled meanwhile (a
        # gather cancels its children, and their caller may cancel them again: the
        # second cancel ended this wait while the thread still received into the buffer).
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # (retrieved: the cancel is this call's outcome)
        raise


#: Threads that start the data plane's threads for :func:`prestart`, at once.
_STARTERS = 8


def prestart(count: int) -> None:
    """Have up to ``count`` worker threads running soon, without waiting.

    The executor starts a thread inside ``submit`` when none is idle, and
    ``Thread.start`` waits until the new thread runs: on a busy machine that
    is milliseconds per thread, spent on the caller's event loop, one thread
    after another. A caller that knows it will want ``count`` requests in
    flight (``cp``) calls this first; helper threads start them while the
    caller lists or stats its sources. Threads only: no task is queued, so
    requests submitted meanwhile are never held up and no extra thread is
    made (best effort: an executor without the hooks is left as it is).

    The helpers start threads side by side: each ``Thread.start`` waits for
    its thread to take the interpreter lock once, which another busy thread
    hands over only every switch interval (5 ms), so one after another 100
    threads took 0.65-0.8 s while the starting process was busy, and 0.03-0.09 s
    from 10-20 helpers (0.02 s idle)."""
    pool = _threads()
    lock = getattr(pool, "_shutdown_lock", None)
    idle = getattr(pool, "_idle_semaphore", None)
    if lock is None or idle is None or not _can_add(pool):
        return
    with _starting_lock:
        want = min(count, MAX_THREADS)
        missing = want - len(pool._threads) - _starting[0]
        if missing <= 0:
            return
        _starting[0] += missing
    per, extra = divmod(missing, _STARTERS)

    def start(n: int) -> None:
        try:
            for _ in range(n):
                with lock:
                    if getattr(pool, "_shutdown", False):
                        return
                if not _add_thread(pool):
                    return
                # The new thread, waiting for work, is idle: it gets a permit of
                # the executor's idle count, or every submit while the others
                # were busy or unused would start yet another thread (a
                # 32-part copy made 67, each start a wait on the event loop).
                idle.release()
        except RuntimeError:  # the interpreter is shutting down
            return
        finally:
            with _starting_lock:
                _starting[0] -= n

    for i in range(min(_STARTERS, missing)):
        n = per + (1 if i < extra else 0)
        if n:
            threading.Thread(target=start, args=(n,), name="tensorstream-prestart",
                             daemon=True).start()


#: Threads that :func:`prestart`'s helpers are starting (and their lock).
_starting = [0]
_starting_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A thread of the parent may have held these locks at the fork (it does not
    exist here, nor do the threads it was starting): new ones. The executor
    itself is replaced on first use (:func:`_threads`)."""
    global _executor_lock, _starting_lock
    _executor_lock, _starting_lock = threading.Lock(), threading.Lock()
    _starting[0] = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def _can_add(pool: concurrent.futures.ThreadPoolExecutor) -> bool:
    """Whether this Python's executor has the worker :func:`_add_thread` starts
    (3.10-3.13: ``_worker(executor_reference, work_queue, initializer, initargs)``)."""
    cft = concurrent.futures.thread
    worker = getattr(cft, "_worker", None)
    queues = getattr(cft, "_threads_queues", None)
    code = getattr(worker, "__code__", None)
    return (code is not None and queues is not None and hasattr(pool, "_work_queue")
            and hasattr(cft, "_global_shutdown_lock") and hasattr(cft, "_shutdown")
            and code.co_varnames[:4] == ("executor_reference", "work_queue", "initializer",
                                         "initargs"))


def _add_thread(pool: concurrent.futures.ThreadPoolExecutor) -> bool:
    """Start one worker thread of ``pool`` the way its ``_adjust_thread_count``
    does, without the executor's lock around ``Thread.start`` (which would put
    the helpers back in line); returns False once the pool is full."""
    cft: Any = concurrent.futures.thread
    p: Any = pool  # the executor's internals, as _can_add found them
    queue = p._work_queue

    def wake(_: object, q: Any = queue) -> None:  # as the executor's own callback
        q.put(None)

    with p._shutdown_lock:
        if len(p._threads) >= MAX_THREADS:
            return False
        name = f"tensorstream-http_{len(p._threads)}"
    t = threading.Thread(name=name, target=cft._worker,
                         args=(weakref.ref(pool, wake), queue, p._initializer, p._initargs))
    if cft._shutdown:  # the interpreter is exiting
        return False
    t.start()  # outside every lock: the helpers start their threads side by side
    # Registered under the locks the executor's own submit holds, as the
    # interpreter's exit hook reads _threads_queues under the global one (to wake
    # and join every worker; a worker it missed still gets the None passed down
    # the queue). Taken in submit's order (the pool's, then the global one): the
    # other order deadlocks against a submit running beside this.
    with p._shutdown_lock, cft._global_shutdown_lock:
        p._threads.add(t)
        cft._threads_queues[t] = queue
    return True
