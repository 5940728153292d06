"""Local-disk provider: positional reads straight into the caller's buffer,
atomic writes (temp file in the destination directory, fsync, rename).

Reads (this module) open every file through :func:`open_regular` and read it
with one ``preadv`` per buffer list, pinned to a version (:mod:`.version`);
writes are :mod:`.writer`'s, listings :mod:`.lister`'s, and the mapping of
``OSError`` to tensorstream errors :mod:`.errors`'.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat as stat_mod
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

from ...errors import (
    InvalidRangeError,
    NotFoundError,
    ObjectChangedError,
    TensorstreamError,
)
from ...readahead._prefault import populate
from ..base import Capabilities, ObjectInfo, Pin, Provider, ReadHints, Writer, report_progress
from .errors import map_local_error
from .lister import list_files
from .temp_names import temp_path_for, temp_stem
from .version import check_version, object_info, version_change
from .writer import AtomicFileWriter, fsync_path, naming_write_errors, temp_copy_hint

# (map_local_error, fsync_path, naming_write_errors, temp_copy_hint, temp_path_for,
# temp_stem and version_change live in the modules named above; imported from here too.)
__all__ = ["LocalProvider", "PinnedFile", "fsync_path", "map_local_error",
           "naming_write_errors", "open_regular", "temp_copy_hint", "temp_path_for", "temp_stem",
           "version_change"]


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file.

    Every local read opens through here. ``O_NONBLOCK`` makes opening a FIFO
    (or a tty, a device) return at once instead of waiting for a writer;
    ``fstat`` on the open descriptor (not the name, which can be swapped)
    then refuses anything that is not a regular file, and only then is the
    descriptor made blocking again. Raises :class:`NotFoundError` (a
    directory, a FIFO, a socket, a device) or the mapped ``OSError``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO/device with no other end
            raise NotFoundError(f"not a regular file: {path}", service="file") from None
        mapped = map_local_error(exc, path)
        if mapped is exc:
            raise
        raise mapped from exc
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            kind = "a directory" if stat_mod.S_ISDIR(st.st_mode) else "not a regular file"
            raise NotFoundError(f"{kind}, not an object: {path}", service="file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_unsized(path: str) -> None:
    """Raise if the regular file ``path``, whose size says 0 bytes, has some: a
    /proc file (``/proc/self/status``, ``/proc/cpuinfo``) is made up as it is
    read, so its size is 0. Read by that size, it was an empty file: an empty
    copy reported copied, an empty read. Whether ``cp`` would read it to its
    end, here every read is by the size."""
    try:
        fd = open_regular(path)
    except (OSError, TensorstreamError):
        return  # not readable (or no longer a file): the read says so
    try:
        has_bytes = bool(os.pread(fd, 1, 0))
    except OSError:
        return
    finally:
        os.close(fd)
    if has_bytes:
        raise NotFoundError(
            f"its size is not known: {path} says 0 bytes but has some (a file the kernel "
            "makes up as it is read, such as one under /proc); copy it to a regular file "
            "first (cat)", service="file")


def _pread_exact(fd: int, path: str, offset: int, buffer: memoryview, etag: str | None) -> int:
    """Fill ``buffer`` from ``offset`` or raise; never returns zero-filled bytes."""
    return _preadv_exact(fd, path, offset, [buffer], etag)


def _preadv_exact(fd: int, path: str, offset: int, buffers: Sequence[memoryview],
                  etag: str | None) -> int:
    """Fill ``buffers``, in order, with the file's consecutive bytes from ``offset``
    (one ``preadv`` for all of them, more only where the kernel returns less) or
    raise; never returns zero-filled bytes. Returns the bytes read."""
    want = sum(b.nbytes for b in buffers)
    st = check_version(fd, path, etag) if etag is not None else os.fstat(fd)
    if offset < 0 or offset + want > st.st_size:
        raise InvalidRangeError(
            f"range [{offset}, {offset + want}) is past the end of a "
            f"{st.st_size}-byte file", service="file", path=path,
        )
    # Fresh tensor memory: fault its pages in with one system call per piece instead of
    # one trap per page inside the copy (less CPU for the same work; never changes bytes).
    for b in buffers:
        populate(b, piece=b.nbytes)
    # (bytes, whatever a buffer's format: the loop below slices them by bytes)
    pending = [b if b.format == "B" and b.ndim == 1 else b.cast("B") for b in buffers if b.nbytes]
    done = 0
    while done < want:
        n = os.preadv(fd, pending, offset + done)
        if n == 0:  # the file shrank under us
            raise ObjectChangedError(
                f"file truncated while reading at byte {offset + done}: {path}",
                service="file",
            )
        done += n
        while pending and n >= pending[0].nbytes:  # drop the buffers now full
            n -= pending[0].nbytes
            pending.pop(0)
        if n:
            pending[0] = pending[0][n:]
    if etag is not None:
        check_version(fd, path, etag)
    return done


class PinnedFile:
    """One version of a local file (``etag``: :meth:`LocalProvider.stat`'s) held open
    for positional reads, from any number of threads, each read gathered into many
    buffers (:func:`_preadv_exact`: one ``preadv`` for neighbouring tensors).

    For loaders that fill a file's tensors in chunks (``readahead.localfill``):
    one read per chunk instead of one trip through the reader's layers per tensor.
    A file replaced by rename meanwhile is not mixed in (the descriptor holds the
    inode); one changed in place is caught by the ``fstat`` around every read
    (:class:`~tensorstream.errors.ObjectChangedError`); a read past the end raises
    :class:`~tensorstream.errors.InvalidRangeError`."""

    def __init__(self, path: str, etag: str) -> None:
        self.path = path
        self.etag = etag
        self._fd = LocalProvider._open_checked(path, etag)

    def read_at(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, in order, with the file's bytes from ``offset``, or raise."""
        _preadv_exact(self._fd, self.path, offset, buffers, self.etag)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> PinnedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PinnedFile({self.path!r})"


#: Bytes per worker-thread hop of an async read (progress is reported between).
_ASYNC_PIECE = 64 << 20
#: Descriptors of pinned files a provider keeps open that no read is using.
_IDLE_FDS = 64


def _pinned_etag(path: str, pin: Pin | None) -> str | None:
    """The file identity a read is pinned to. A pin without one (a version
    from another stat) is checked by size alone, before the read."""
    if pin is None:
        return None
    if pin.etag is None and pin.size is not None:
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise map_local_error(exc, path) from exc
        pin.check(Pin(size=size), service="file", path=path)
    return pin.etag


#: Every local provider of this process (weak): a forked child gives each a new lock
#: (a thread of the parent, which does not exist there, may have held it).
_providers: weakref.WeakSet[LocalProvider] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for provider in list(_providers):
        provider._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class LocalProvider(Provider):
    """Files on local disk. Paths are absolute filesystem paths."""

    schemes = ("file",)
    service = "file"
    capabilities: ClassVar[Capabilities] = Capabilities(
        write=True, list=True, delete=True, pinned_reads=True, blocking_reads=True,
    )
    read_hints: ClassVar[ReadHints] = ReadHints(inline=True)
    option_names = frozenset()

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> LocalProvider:
        options.pop("config", None)
        return cls()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (path, etag) -> [descriptor, reads using it], least recently used first.
        self._fds: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self._pid = os.getpid()
        _providers.add(self)

    def __repr__(self) -> str:
        return "LocalProvider()"

    async def stat(self, path: str) -> ObjectInfo:
        def run() -> ObjectInfo:
            try:
                st = os.stat(path)
            except OSError as exc:
                raise map_local_error(exc, path) from exc
            if not stat_mod.S_ISREG(st.st_mode):
                raise NotFoundError(f"not a regular file: {path}", service="file")
            if st.st_size == 0:
                _refuse_unsized(path)
            return object_info(path, st)

        return await asyncio.to_thread(run)

    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        # In pieces, so the timeout layer sees progress on a long read.
        etag = _pinned_etag(path, pin)
        done = 0
        while True:
            piece = buffer[done : done + _ASYNC_PIECE]
            done += await asyncio.to_thread(self._readinto_sync, path, offset + done, piece,
                                            etag)
            report_progress()
            if done >= len(buffer):
                return done

    def readinto_blocking(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """``preadv`` straight into ``buffer`` in the calling thread (releases the GIL)."""
        return self._readinto_sync(path, offset, buffer, _pinned_etag(path, pin))

    def _pinned_fd(self, path: str, etag: str) -> int:
        """An open descriptor of the version ``etag`` of ``path``, for one read
        (hand it back with :meth:`_unpin_fd`), kept open afterwards: a reader's
        many small reads (tensor headers) cost one ``preadv`` each, not an
        open/fstat/close. A file replaced by rename keeps being read from the
        pinned inode (one consistent version); one changed in place is caught
        by the ``fstat`` around every read.

        At most :data:`_IDLE_FDS` descriptors no read is using are kept
        (the least recently used are closed): every one was kept for the
        provider's lifetime, and ``cp -r`` of a folder of many files held one
        per file until it ended ("Too many open files" after ~1000 under the
        common limit of 1024)."""
        key = (path, etag)
        with self._lock:
            if self._pid != os.getpid():  # descriptors are shared with the parent: drop
                self._fds = OrderedDict()
                self._pid = os.getpid()
            entry = self._fds.get(key)
            if entry is not None:
                entry[1] += 1
                self._fds.move_to_end(key)
                return entry[0]
        fd = self._open_checked(path, etag)
        with self._lock:
            entry = self._fds.get(key)
            if entry is None:
                self._fds[key] = [fd, 1]
                spare = None
            else:  # another thread opened it first
                entry[1] += 1
                spare, fd = fd, entry[0]
        if spare is not None:
            os.close(spare)
        return fd

    def _unpin_fd(self, path: str, etag: str) -> None:
        """One read of :meth:`_pinned_fd`'s descriptor is over; close the least
        recently used descriptors no read is using, beyond the limit."""
        with self._lock:
            entry = self._fds.get((path, etag))
            if entry is not None:
                entry[1] -= 1
            idle = [k for k, (_, users) in self._fds.items() if not users]
            closing = [self._fds.pop(k)[0] for k in idle[: max(0, len(idle) - _IDLE_FDS)]]
        for fd in closing:
            os.close(fd)

    @staticmethod
    def _open_checked(path: str, etag: str | None) -> int:
        fd = open_regular(path)
        if etag is not None:
            try:
                check_version(fd, path, etag)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def _readinto_sync(self, path: str, offset: int, buffer: memoryview, etag: str | None) -> int:
        if etag is None:  # unpinned: this read opens (and closes) the path itself
            fd = self._open_checked(path, None)
            try:
                return _pread_exact(fd, path, offset, buffer, None)
            finally:
                os.close(fd)
        fd = self._pinned_fd(path, etag)
        try:
            return _pread_exact(fd, path, offset, buffer, etag)
        finally:
            self._unpin_fd(path, etag)

    async def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, OrderedDict()
            owned = self._pid == os.getpid()
        if owned:
            for fd, _ in fds.values():
                os.close(fd)

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        for info in await asyncio.to_thread(list_files, prefix):
            yield info

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        """``mode``: the published file's permissions (default 0666 less the umask)."""
        return AtomicFileWriter(path, mode=kwargs.get("mode"))

    async def delete(self, path: str) -> None:
        def run() -> None:
            try:
                os.unlink(path)
            except OSError as exc:
                raise map_local_error(exc, path) from exc

        await asyncio.to_thread(run)

