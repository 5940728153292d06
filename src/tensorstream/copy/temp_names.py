"""Whose a temp file in a local destination's directory is, and removing a name there.

A temp file is a live run's while that run holds its ``flock`` (:func:`lock_or_busy`);
a lock is taken on a file but a removal is of a name, so a run checks that the name
still is the file it locked (:func:`still_named`) before it writes or removes.
What an earlier run left under one of a copy's fixed names is removed without
following a symlink or opening a FIFO (:func:`discard_leftover`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time

__all__ = ["busy", "discard_leftover", "lock_or_busy", "still_named", "unlink"]


def busy(name: str) -> OSError:
    """The error for a temp file ``name`` that another live run holds."""
    return OSError(errno.EBUSY, f"{name} is in use: another tensorstream copy to this "
                   "destination is running")


def lock_or_busy(fd: int, name: str, *, wait: float = 0.0) -> None:
    """Take the lock that marks ``fd`` as a live run's temp file, or say another run has it.

    ``wait``: seconds to keep trying (a file this run has just created, which
    another run's scan for stale temp files may hold for a moment)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise busy(name) from None
            time.sleep(0.005)


def still_named(fd: int, dir_fd: int, name: str) -> bool:
    """Whether ``name`` in ``dir_fd`` is still the file open as ``fd``.

    A lock is taken on a file, a removal is of a name: a run that got the lock
    on a temp file it opened by name may only remove the name (or write to the
    file) once it knows its run published or removed neither in between. Every
    run changes a temp file's name only while it holds the file's lock, so the
    answer stays true while the lock is held."""
    try:
        named = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    st = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)


def unlink(dir_fd: int, name: str) -> None:
    """Remove ``name`` in ``dir_fd`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def discard_leftover(dir_fd: int, name: str, *, strict: bool = True) -> None:
    """Remove what an earlier run left under one of a copy's fixed names
    (a file, or a symlink or FIFO someone put there: never followed). A
    directory cannot be ours: with ``strict`` it is an error naming it,
    else it is left alone (the copy does not use the name)."""
    try:
        unlink(dir_fd, name)
    except (IsADirectoryError, PermissionError) as exc:
        if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise
        if strict:
            raise OSError(errno.EISDIR, f"{name} in the destination is a directory, not a "
                          "partial file of tensorstream (remove it)") from exc
