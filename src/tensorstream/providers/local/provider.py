"""Local-disk provider: positional reads straight into the caller's buffer,
atomic writes (temp file in the destination directory, fsync, rename)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat as stat_mod
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, ClassVar

from ... import _loop
from ..._umask import new_file_mode
from ...errors import (
    InvalidRangeError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    TensorstreamError,
)
from ...readahead._prefault import populate
from ..base import Capabilities, ObjectInfo, Pin, Provider, ReadHints, Writer, report_progress

__all__ = ["LocalProvider", "PinnedFile", "fsync_path", "map_local_error",
           "naming_write_errors", "open_regular", "temp_copy_hint", "temp_path_for", "temp_stem",
           "version_change"]


def _etag(st: os.stat_result) -> str:
    """A file's version: mtime, size, inode, change time, a print of its mode and
    owner, and its link count.

    mtime alone is not enough: ``rsync -t``, ``cp -p`` and ``tar -x`` rewrite a
    file in place and then put its old mtime back (``utime``). The change time
    (``ctime``) and the inode cannot be set by a user, so a rewrite shows there.
    """
    return (f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}-{st.st_ctime_ns:x}"
            f"-{_owner_print(st):x}-{st.st_nlink:x}")


def _owner_print(st: os.stat_result) -> int:
    return zlib.crc32(f"{st.st_mode}:{st.st_uid}:{st.st_gid}".encode())


def version_change(st: os.stat_result, etag: str) -> str | None:
    """Why the file whose ``fstat`` is ``st`` is no longer version ``etag``
    (:func:`_etag`'s), or None when it still is.

    The change time also moves on a change of metadata alone. A hard link made
    or removed (the name renamed over or unlinked while the file is open) shows
    in the link count and leaves the bytes alone: not a new version. A change
    of mode or owner is one: ``cp -p`` and ``rsync -pt`` rewrite a file in place,
    then put back its mode and its old mtime, and the bytes read before and
    after cannot be told to be of one version (a chmod mid-load fails the load;
    loading again reads one version). The change time moving alone (chmod to the
    same mode, an xattr or ACL set) cannot be told from such a rewrite either.
    """
    now = _etag(st)
    if now == etag:
        return None
    mine, pinned = now.split("-"), etag.split("-")
    if mine[:3] != pinned[:3] or len(pinned) != len(mine):
        return "its modification time, size or inode changed"
    if mine[4] != pinned[4]:
        return ("its change time, mode or owner moved while its modification time and size "
                "stayed: rewritten in place and its metadata put back (cp -p, rsync -pt), or "
                "chmod/chown while it was read")
    if mine[5] != pinned[5]:
        return None  # (a link made or removed: the same bytes under fewer or more names)
    return ("its change time moved while its modification time and size stayed: rewritten "
            "in place with its old mtime put back, as rsync -t, cp -p and tar -x do")


def map_local_error(exc: OSError, path: str) -> TensorstreamError | OSError:
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return NotFoundError(f"no such file: {path}", service="file")
    if isinstance(exc, PermissionError):
        return PermissionDeniedError(f"permission denied: {path}", service="file")
    if exc.errno == errno.EISDIR or isinstance(exc, IsADirectoryError):
        return NotFoundError(f"is a directory, not an object: {path}", service="file")
    if exc.errno in _NAMES_NO_FILE:
        # A path no file can have (a shard name from an index: "s.safetensors/x", 300
        # characters, a symlink loop) was a bare OSError, not a tensorstream error.
        return NotFoundError(f"no such file ({_NAMES_NO_FILE[exc.errno]}): {path}",
                             service="file")
    return exc


#: errnos of a path that names no file, and what each means.
_NAMES_NO_FILE = {errno.ENOTDIR: "a part of the path is not a directory",
                  errno.ENAMETOOLONG: "the name is too long",
                  errno.ELOOP: "too many levels of symbolic links"}


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


def _info(path: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(
        path=path,
        size=st.st_size,
        etag=_etag(st),
        mtime=datetime.fromtimestamp(st.st_mtime, tz=timezone.utc),
        # Permission bits, for a local copy to take as cp does (``extra["mode"]``).
        extra={"mode": stat_mod.S_IMODE(st.st_mode) & 0o777},
    )


def _check_version(fd: int, path: str, etag: str) -> os.stat_result:
    st = os.fstat(fd)
    why = version_change(st, etag)
    if why is not None:
        raise ObjectChangedError(f"file changed while it was being read: {path} ({why}); "
                                 "read it again", service="file")
    return st


def _pread_exact(fd: int, path: str, offset: int, buffer: memoryview, etag: str | None) -> int:
    """Fill ``buffer`` from ``offset`` or raise; never returns zero-filled bytes."""
    return _preadv_exact(fd, path, offset, [buffer], etag)


def _preadv_exact(fd: int, path: str, offset: int, buffers: Sequence[memoryview],
                  etag: str | None) -> int:
    """Fill ``buffers``, in order, with the file's consecutive bytes from ``offset``
    (one ``preadv`` for all of them, more only where the kernel returns less) or
    raise; never returns zero-filled bytes. Returns the bytes read."""
    want = sum(b.nbytes for b in buffers)
    st = _check_version(fd, path, etag) if etag is not None else os.fstat(fd)
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
        _check_version(fd, path, etag)
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
            return _info(path, st)

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
                _check_version(fd, path, etag)
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
        for info in await asyncio.to_thread(self._list_sync, prefix):
            yield info

    def _list_sync(self, prefix: str) -> builtins.list[ObjectInfo]:
        if os.path.isdir(prefix):
            root, name_prefix = prefix, ""
        else:
            root, name_prefix = os.path.split(prefix)
        out: list[ObjectInfo] = []
        if not os.path.isdir(root):
            return out
        # Depth first with a stack of our own (a tree deeper than the recursion limit is
        # listed, not a RecursionError); "dir/na" walks only dir's entries named na*, not
        # all of dir (for "/nonexistent" that was the whole file system).
        pending = [(root, True)]
        while pending:
            directory, top = pending.pop()
            try:
                with os.scandir(directory) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                continue
            subdirs: builtins.list[tuple[str, bool]] = []
            for entry in entries:
                if top and not entry.name.startswith(name_prefix):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append((entry.path, False))
                        continue
                    if _is_temp_name(entry.name):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat_mod.S_ISREG(st.st_mode):
                    out.append(_info(entry.path, st))
            pending.extend(reversed(subdirs))
        out.sort(key=lambda i: i.path)
        return out

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        """``mode``: the published file's permissions (default 0666 less the umask)."""
        return _AtomicFileWriter(path, mode=kwargs.get("mode"))

    async def delete(self, path: str) -> None:
        def run() -> None:
            try:
                os.unlink(path)
            except OSError as exc:
                raise map_local_error(exc, path) from exc

        await asyncio.to_thread(run)


_TEMP_MARK = ".tensorstream-"


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and _TEMP_MARK in name and name.endswith(".tmp")


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


#: The longest name a file may have (bytes; NAME_MAX on Linux, macOS and Windows).
_NAME_MAX = 255
#: The longest ending a temp file adds to its stem (``0123456789ab.tmp``).
_LONGEST_END = 16


def temp_stem(name: str) -> str:
    """The start of every temp file name of ``name``'s copy: ``.NAME.tensorstream-``,
    or for a name too long for that (225-255 bytes, which the destination takes)
    ``.NAM~<sha256 of the name>.tensorstream-``."""
    stem = f".{name}{_TEMP_MARK}"
    if len(os.fsencode(stem)) + _LONGEST_END <= _NAME_MAX:
        return stem
    mark = f"~{hashlib.sha256(os.fsencode(name)).hexdigest()[:16]}{_TEMP_MARK}"
    room = _NAME_MAX - _LONGEST_END - len(mark) - 1
    head = os.fsencode(name)[:room].decode("utf-8", "ignore")  # whole characters
    while len(os.fsencode(head)) > room:  # surrogate-escaped bytes: one more cut
        head = head[:-1]
    return f".{head}{mark}"


def temp_path_for(path: str) -> str:
    """A unique temporary name next to ``path`` (same directory, same filesystem).
    Short enough for any name ``path`` may have: ``.NAME.tensorstream-XXXX.tmp`` of a
    225-255-byte name was too long, and open(path, "wb"), serialize, convert and
    safetensors.save failed on a name cp takes (:func:`temp_stem`)."""
    d, name = os.path.split(path)
    return os.path.join(d, f"{temp_stem(name)}{secrets.token_hex(6)}.tmp")


def _check_destination(path: str) -> None:
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


class _AtomicFileWriter(Writer):
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
        _check_destination(self.path)
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
        _check_destination(self.path)  # a FIFO or device may have appeared meanwhile
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
