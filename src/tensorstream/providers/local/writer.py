"""Atomic local writes: a locked 0600 temp file beside the destination, fsync,
rename; and the helpers other local writers share (destination checks, naming
the file in a write's ``OSError``, directory fsyncs)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import stat as stat_mod
import time
from collections.abc import Callable, Iterator
from typing import Any

from ... import _loop
from ..._umask import new_file_mode
from ...errors import NotFoundError, TensorstreamError
from ..base import Writer
from .errors import map_local_error
from .temp_names import temp_path_for

__all__ = ["AtomicFileWriter", "check_destination", "fsync_path", "naming_write_errors",
           "temp_copy_hint"]


def _lock_if_named(fd: int, path: str) -> bool:
    """Lock the new temp file ``fd`` (the mark of a live writer) and say whether
    ``path`` still names it (another process's scan for dead temp files may have
    removed it before the lock; one may hold it for a moment: waited for)."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    st = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)


def fsync_path(path: str, *, directory: bool = False) -> None:
    """Flush ``path`` (a file, or a directory's entries with ``directory``) to disk."""
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_destination(path: str) -> None:
    """Refuse to replace anything but a regular file (or a symlink, which is
    replaced, not followed): renaming over a directory fails late, and over a
    FIFO or a device node it would replace the node."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat_mod.S_ISDIR(st.st_mode):
        raise TensorstreamError(f"destination is a directory: {path}", service="file")
    if not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISLNK(st.st_mode)):
        raise TensorstreamError(f"destination is not a regular file: {path}", service="file")


@contextlib.contextmanager
def naming_write_errors(path: str, hint: str = "") -> Iterator[None]:
    """An ``OSError`` of a write without a file name (``ENOSPC``, ``EFBIG``,
    ``EDQUOT``, ``EIO``: a bare "No space left on device") names ``path`` (the
    destination, whose temporary file is beside it, or a temporary copy),
    with ``hint`` after the reason."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None or isinstance(exc, TensorstreamError):
            raise
        raise OSError(exc.errno, f"{exc.strerror}{hint}; nothing was published", path) from exc


def temp_copy_hint(who: str, destination: Any) -> str:
    """What :func:`naming_write_errors` adds for the local temporary copy ``who``
    makes of a whole file before sending it to a remote ``destination``
    (tensorizer seeks in what it writes)."""
    return (f" (the local copy {who} makes before sending {destination.redacted()}: set "
            "TMPDIR to a disk with room for the whole file)")


class AtomicFileWriter(Writer):
    """Write to a 0600 temp file beside the destination; fsync + rename on commit.

    Abort is final: a write or commit runs in a thread that cannot be stopped,
    so :meth:`abort` waits for it before it closes the descriptor (closed under
    the thread, its number could be reused and receive the thread's writes)
    and removes the temp file; a commit whose rename happened meanwhile is
    removed again (while the destination is still our file), and never
    reported as a success."""

    def __init__(self, path: str, *, mode: int | None = None) -> None:
        self.path = path
        self._mode = mode
        self._tmp: str | None = None
        self._fd: int | None = None
        self._done = False
        #: The thread's work in flight; the abort, once begun; a commit the
        #: caller was told of; the published file's (st_dev, st_ino).
        self._busy: asyncio.Future[None] | None = None
        self._aborting: asyncio.Future[None] | None = None
        self._committed = False
        self._published: tuple[int, int] | None = None

    def _open(self) -> None:
        directory = os.path.dirname(self.path) or "."
        if not os.path.isdir(directory):
            raise NotFoundError(f"destination directory does not exist: {directory}",
                                service="file")
        check_destination(self.path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        for _ in range(5):
            tmp = temp_path_for(self.path)
            try:
                # _tmp only once it exists: the abort removes it, and unlinking a name
                # never created failed on a read-only filesystem (EROFS, not ENOENT),
                # an error that took the place of this one.
                self._fd = os.open(tmp, flags, 0o600)
            except OSError as exc:
                # Named by the destination, not by a temp file nobody asked for
                # (a read-only filesystem, a directory the user may not write).
                mapped = map_local_error(exc, self.path)
                if mapped is exc and exc.errno not in (errno.EEXIST, errno.ELOOP):
                    mapped = OSError(exc.errno, f"cannot create it: {exc.strerror}", self.path)
                raise mapped from exc
            # Locked, as cp's temp files are: a cp or sync into the same directory
            # removes the unlocked ones as a killed run's. One whose scan came
            # between the create and the lock removed it: made again.
            if _lock_if_named(self._fd, tmp):
                self._tmp = tmp
                break
            os.close(self._fd)
            self._fd = None
        else:
            raise OSError(errno.EBUSY, "another process keeps removing its temp file", self.path)
        _loop.abort_at_exit(self)  # still open at interpreter exit: remove the temp file

    def _write_sync(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise ValueError("write after commit/abort")
        if self._fd is None:
            self._open()
        assert self._fd is not None
        view = memoryview(data).cast("B")
        with naming_write_errors(self.path):
            while view:
                n = os.write(self._fd, view)
                view = view[n:]

    async def _in_thread(self, fn: Callable[[], None]) -> None:
        """``fn()`` in a thread, which runs to its end whoever stops waiting;
        :meth:`abort` waits for it."""
        if self._aborting is not None:
            raise ValueError("write to an aborted local writer")
        busy = self._busy = asyncio.ensure_future(asyncio.to_thread(fn))
        busy.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
        await asyncio.shield(busy)
        if self._aborting is not None:  # aborted meanwhile: the abort undoes it
            raise ValueError("the local writer was aborted")

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self._in_thread(lambda: self._write_sync(data))
        except BaseException:
            await self.abort()
            raise

    def _commit_sync(self) -> None:
        if self._done:
            return
        if self._fd is None:
            self._open()
        assert self._fd is not None and self._tmp is not None
        os.fchmod(self._fd, new_file_mode() if self._mode is None else self._mode)
        with naming_write_errors(self.path):  # (a full disk may only show here, on NFS say)
            os.fsync(self._fd)
        st = os.fstat(self._fd)
        check_destination(self.path)  # a FIFO or device may have appeared meanwhile
        os.replace(self._tmp, self.path)  # before the lock goes with the descriptor
        self._published = (st.st_dev, st.st_ino)
        os.close(self._fd)
        self._fd = None
        self._tmp = None
        self._done = True
        try:
            dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)

    async def commit(self) -> None:
        if self._committed:
            return
        try:
            await self._in_thread(self._commit_sync)
        except BaseException:
            await self.abort()
            raise
        self._committed = True

    def _abort_sync(self) -> None:
        self._done = True
        if self._published is not None:
            self._unpublish()
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self._tmp = None

    async def abort(self) -> None:
        if self._committed:
            return
        if self._aborting is None:
            self._aborting = asyncio.ensure_future(self._abort())
        await asyncio.shield(self._aborting)  # cleanup finishes even if we are cancelled

    async def _abort(self) -> None:
        if self._busy is not None:
            await asyncio.gather(self._busy, return_exceptions=True)
        # Here, not in a thread: at interpreter exit no new thread may start.
        self._abort_sync()

    def _unpublish(self) -> None:
        """Remove a file a commit racing the abort published, if it still is ours."""
        ours, self._published = self._published, None
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return
        if ours == (st.st_dev, st.st_ino):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
