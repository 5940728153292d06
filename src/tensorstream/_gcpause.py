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
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_depth = 0  # loads running now
_restore = False  # the collector was enabled when the first of them began


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause automatic collection for the block (loads may nest or overlap in
    threads: it resumes when the last one ends, and only if it was enabled)."""
    global _depth, _restore
    with _lock:
        if _depth == 0:
            _restore = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore:
                gc.enable()
