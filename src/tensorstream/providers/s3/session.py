"""botocore session helpers shared by the S3 provider's clients: one data
loader per process."""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["shared_data_loader"]

_loader_lock = threading.Lock()
_loaders: dict[tuple[int, str | None], Any] = {}


def _after_fork_in_child() -> None:
    """A thread of the parent may have held the lock at the fork (it does not exist here)."""
    global _loader_lock
    _loader_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
