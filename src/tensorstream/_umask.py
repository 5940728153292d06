"""The process's umask, read without setting it.

``os.umask`` can only be read by setting it: ``u = os.umask(0); os.umask(u)``
leaves the whole process at umask 0 in between, so a file or directory another
thread creates then is world-writable, and two threads doing it at once can
leave the umask at 0 for good. Linux (4.7+) shows it in ``/proc/self/status``.
"""

from __future__ import annotations

import os
import threading

__all__ = ["current_umask", "new_file_mode"]

_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A thread of the parent may have held the lock at the fork (it does not exist here)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_umask() -> int:
    """The umask, from ``/proc/self/status`` where it is shown; elsewhere set and put
    back under a lock, through 077 (what another thread creates meanwhile is private)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _lock:
        umask = os.umask(0o077)
        os.umask(umask)
    return umask


def new_file_mode() -> int:
    """The mode a file created with 0666 gets: what a published copy is given."""
    return 0o666 & ~current_umask()
