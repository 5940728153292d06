"""Helpers for tests that close a reader while other threads read it
(``tests/test_file.py``, ``tests/readahead/test_close_from_another_thread.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def read_until_closed(f: Any, data: bytes, errors: list[BaseException], size: int) -> None:
    """Read ``f`` ``size`` bytes at a time to its end or until it is closed
    (``ValueError``); every piece must be bytes of ``data`` at or after the
    position seen before the read (another thread may read in between). Any
    other error goes to ``errors``."""
    try:
        while True:
            pos = f.tell()
            got = f.read(size)
            if not got:
                return
            assert data.find(got, pos) >= 0
    except ValueError:
        return  # the reader was closed
    except BaseException as exc:  # reported by the caller
        errors.append(exc)


def close_under_readers(f: Any, targets: list[Callable[[], None]], delay: float,
                        what: str = "") -> None:
    """Run each of ``targets`` in a thread, close ``f`` after ``delay`` seconds,
    and require every thread to end within 10 s (a read that hangs fails here)."""
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    time.sleep(delay)
    f.close()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), f"a read hung {what}"
