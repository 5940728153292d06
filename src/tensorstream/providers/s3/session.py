"""botocore session helpers shared by the S3 provider's clients: one data
loader per process, and the cyclic GC paused while a client is built."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["gc_paused", "shared_data_loader"]

_loader_lock = threading.Lock()
_loaders: dict[tuple[int, str | None], Any] = {}


def shared_data_loader(session: Any) -> Any:
    """botocore's data loader (service models, endpoint rules), one per process.

    Loading the S3 model and endpoint data costs ~0.1 s per session; the
    loader holds only botocore's bundled JSON, never credentials, so sharing
    it is safe (boto3's default session does the same). Each provider still
    gets its own session, so credentials found by botocore's chain stay
    with it. Keyed by pid (a child re-creates it after fork) and by
    ``AWS_DATA_PATH``.
    """
    from botocore.loaders import create_loader

    data_path = session.get_config_variable("data_path")
    key = (os.getpid(), data_path)
    with _loader_lock:
        loader = _loaders.get(key)
        if loader is None:
            _loaders.clear()  # entries of a parent process or an old data path
            loader = _loaders[key] = create_loader(data_path)
    return loader


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while botocore builds a client.

    Parsing the S3 model and endpoint rules makes hundreds of thousands of
    objects; in a process that has imported torch, the collections they
    trigger walk torch's whole heap and triple the time (measured: 0.18 s ->
    0.06 s for a first client). Nested and concurrent uses are counted: the
    GC is enabled again by the last one out, and only if it was enabled.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True
