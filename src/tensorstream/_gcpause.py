"""The cyclic garbage collector paused while a load builds its tensors (or
botocore builds an S3 client: parsing its model and endpoint rules makes
hundreds of thousands of objects, and the collections they set off walked
torch's whole heap).

Why: a load of thousands of tensors allocates tens of thousands of objects
that all live on (the tensors, their storages, the state dict), so Python's
collector keeps running while it builds them, and a full collection walks
every object of a process that imported torch, holding the interpreter lock:
every thread of the load (the one receiving the network's bytes included)
stops for it. Nothing a load makes is cyclic garbage worth collecting
before it ends; the collector runs again, as the process had it, once the
last of the loads running at once has returned.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
#: Loads running now: how many each thread runs (by thread ident). By thread, so
#: that a forked child keeps only its own (see :func:`_after_fork_in_child`).
_holders: dict[int, int] = {}
_restore = False  # the collector was enabled when the first of them began


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause automatic collection for the block (loads may nest or overlap in
    threads: it resumes when the last one ends, and only if it was enabled)."""
    global _restore
    me = threading.get_ident()
    with _lock:
        if not _holders:
            _restore = gc.isenabled()
            gc.disable()
        _holders[me] = _holders.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:
            left = _holders.pop(me) - 1
            if left:
                _holders[me] = left
            if not _holders and _restore:
                gc.enable()


def _after_fork_in_child() -> None:
    """A child forked while other threads loaded (a DataLoader's workers, a
    ``multiprocessing`` pool) has only the forking thread: the others' loads do
    not go on here, so they never resume the collector. It ran disabled for the
    child's whole life. The lock is new too: another thread may have held it."""
    global _lock
    _lock = threading.Lock()
    me = threading.get_ident()
    if not _holders:
        return
    mine = _holders.get(me, 0)
    _holders.clear()
    if mine:
        _holders[me] = mine  # the forking thread's own load ends here as it would have
    elif _restore:
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)
