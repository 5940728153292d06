"""A ``cp`` destination's local temp file (:class:`LocalPartFile`): parts written in
whatever order they arrive with ``os.pwrite`` into a temp file beside the destination
(opened through a directory descriptor, so symlinks are never followed; ours alone,
locked, so never read back and never taken for a killed run's), straight to the disk
(``O_DIRECT``, :mod:`.direct`) when it is to be durable, else asking the kernel to start
writing each part at once; a small resume journal when asked; published with one fsync +
rename."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator

from .._umask import new_file_mode
from ..errors import IntegrityError
from ..providers.local.provider import temp_stem
from .direct import ALIGN, PositionalWrites, open_direct
from .resume_journal import JOURNAL_VERSION, load_journal, write_journal
from .select import carried
from .sinks import PartBuffer, digest, directory_sync, plan_parts
from .temp_names import busy, discard_leftover, lock_or_busy, still_named, unlink

__all__ = ["JOURNAL_VERSION", "LocalPartFile"]

_CHECKPOINT_SECONDS = 1.0
#: How long a new temp file's lock is waited for (another run's scan holds
#: it only while it checks and removes the name), and how many fresh names
#: are tried when such a scan removed the file first.
_SCAN_WAIT = 2.0
_CREATE_TRIES = 5



def _load_sync_file_range() -> Callable[[int, int, int], None] | None:
    """Linux ``sync_file_range(fd, off, n, SYNC_FILE_RANGE_WRITE)``, or None.

    It starts writeback of a range without waiting for it: not a durability
    point (the fsync before publishing is), but it keeps dirty pages from
    piling up, so that fsync finds little left to write (measured: 512 MiB,
    fsync 0.25 s -> 0.003 s, and no dirty-page throttling of the writes).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start_writeback(fd: int, offset: int, length: int) -> None:
        fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; a failure only costs speed

    return start_writeback


_start_writeback = _load_sync_file_range()


def _read_exact(fd: int, view: memoryview, offset: int) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise IntegrityError(f"destination is short at byte {offset + got}")
        got += n




_HASH_CHUNK = 4 << 20


def _give_date(fd: int, when_ns: int) -> str | None:
    """Date the file ``when_ns`` (its source's); None when it kept it (as its filesystem
    keeps dates: :func:`~.select.carried`), else why not. A filesystem may refuse
    (``EPERM``: a FUSE, 9p or SMB mount, a file owned by another user) or clamp the
    date to its range without an error (ext4 keeps dates up to 2446, XFS without
    bigtime up to 2038)."""
    try:
        os.utime(fd, ns=(when_ns, when_ns))
    except OSError as exc:
        return exc.strerror or str(exc)
    except (OverflowError, ValueError):
        return "a date out of the range a file can have"
    kept = os.fstat(fd).st_mtime_ns
    if kept == when_ns or carried(_as_date(when_ns), _as_date(kept)):
        return None
    return f"the filesystem keeps {_as_date(kept):%Y-%m-%d %H:%M:%S} instead"


def _as_date(ns: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(microseconds=ns // 1000)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class LocalPartFile:
    """Positional writes into a temp file in ``dir_fd``, published as ``name``.

    With ``resume=True`` the temp file and a journal (source identity and the
    digests of completed parts) have fixed hidden names, survive an
    interruption, and are picked up by the next ``resume=True`` run if the
    source is unchanged.
    """

    def __init__(self, dir_fd: int, name: str, *, size: int, part_size: int,
                 source: str, etag: str | None, resume: bool, durable: bool = True,
                 direct: bool = True, existing: Collection[str] | None = None,
                 mtime_ns: int | None = None, mode: int | None = None,
                 on_date_lost: Callable[[str], None] | None = None) -> None:
        self.dir_fd = dir_fd
        #: Called (with why) when the file does not keep :attr:`mtime_ns`: ``sync``
        #: then takes it as changed and copies it again on every run.
        self.on_date_lost = on_date_lost
        #: The published file's permissions (None: 0666 less the umask).
        self.mode = mode
        #: The source's modification time (ns since the epoch), given to the file
        #: before it is published; None: the file keeps the time it was written.
        self.mtime_ns = mtime_ns
        #: The directory's names when the copy began (``None``: list it): where
        #: temp files of earlier runs are looked for.
        self.existing = existing
        self.name = name
        self.size = size
        self.part_size = part_size
        self.identity = {"v": JOURNAL_VERSION, "source": source, "size": size,
                         "etag": etag, "part_size": part_size}
        # A weak ETag (W/"...") names equivalent content, not the same bytes: parts
        # kept under one could be spliced with another version's (no resume, as
        # without an ETag).
        self.resume = resume and etag is not None and not etag.strip().startswith("W/")
        #: fsync before the rename (and the directory after): the object is on
        #: the disk when it appears. Without, it appears as soon as it is whole
        #: in the page cache (readers still never see a part of it).
        self.durable = durable
        #: Write aligned stretches with ``O_DIRECT`` where the filesystem can
        #: (see :mod:`.direct`): they reach the disk without a page-cache copy,
        #: and the file is not in the page cache afterwards.
        self.direct = direct
        #: The file's writes (set by :meth:`open`).
        self.writes: PositionalWrites | None = None
        base = temp_stem(name)
        self.tmp = base + ("partial.tmp" if self.resume else f"{secrets.token_hex(6)}.tmp")
        self.journal = base + "journal.tmp"
        self.done: dict[int, str] = {}
        self._fd: int | None = None
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False
        self._done_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._last_checkpoint = time.monotonic()
        self._published = False

    # -- open / resume --------------------------------------------------------
    def open(self) -> int:
        """Create (or reopen for resume) the temp file; returns bytes already done."""
        if self.resume:
            self.done = self._load_journal()
            if not self.done:  # starting over: a fresh file, whatever had the name
                self._remove_unless_live(self.tmp)
        else:
            self._discard_earlier_partial()
        self._remove_stale_temps()
        # O_NONBLOCK: a FIFO planted under the name must fail the checks below,
        # not block the copy (in a thread no signal can stop) until a writer comes.
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | os.O_NOFOLLOW | os.O_NONBLOCK
        created = not self.done
        flags |= os.O_CREAT | os.O_EXCL if created else 0
        for attempt in range(_CREATE_TRIES):
            try:
                fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dir_fd)
            except FileExistsError:
                if not self.resume:
                    raise
                raise busy(self.tmp) from None  # made since it was removed: another live run's
            except OSError as exc:
                if self.done or exc.errno == errno.ELOOP:
                    raise
                # Said of the destination: the temp file's name alone ("Read-only file
                # system: '.x.tensorstream-3f2a.tmp'") was a file nobody asked for.
                raise OSError(exc.errno, f"cannot create {self.name!r} in its directory: "
                              f"{exc.strerror}") from exc
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EEXIST, f"{self.tmp} is not a regular file (remove it)")
                os.set_blocking(fd, True)
                # The lock marks the temp file as owned by a live run (see
                # _remove_stale_temps). Between the create and the lock, another
                # run's scan may take the file for a dead run's and remove it.
                lock_or_busy(fd, self.tmp, wait=_SCAN_WAIT if created else 0.0)
                if not still_named(fd, self.dir_fd, self.tmp):
                    if not created or attempt == _CREATE_TRIES - 1:
                        raise busy(self.tmp)  # a live run has replaced the file since
                    os.close(fd)  # removed as a dead run's: made again
                    if not self.resume:
                        self.tmp = temp_stem(self.name) + f"{secrets.token_hex(6)}.tmp"
                    continue
                if os.fstat(fd).st_nlink != 1:  # linked since the journal was read
                    raise OSError(errno.EEXIST, f"{self.tmp} has another name (a hard link), "
                                  "so it is not a partial file of tensorstream (remove it)")
                os.ftruncate(fd, self.size)
            except BaseException:
                os.close(fd)
                if not self.resume:
                    unlink(self.dir_fd, self.tmp)
                raise
            break
        self._fd = fd
        self.writes = PositionalWrites(
            fd, open_direct(self.dir_fd, self.tmp, fd) if self.direct else None)
        return sum(min(self.part_size, self.size - i * self.part_size) for i in self.done)

    def _remove_stale_temps(self) -> None:
        """Delete temp files of earlier runs for this name that no live process holds.

        A run killed with SIGKILL cannot clean up; its temp file stays unlocked
        (flock dies with the process), so the next run removes it. Resume files
        (``partial``/``journal``) are left to the resume logic.
        """
        prefix = temp_stem(self.name)
        keep = {self.base_partial(), self.journal}
        try:
            names = os.listdir(self.dir_fd) if self.existing is None else self.existing
        except OSError:
            return
        for entry in names:
            if not (entry.startswith(prefix) and entry.endswith(".tmp")) or entry in keep:
                continue
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                             | getattr(os, "O_CLOEXEC", 0), dir_fd=self.dir_fd)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue  # not a temp file of ours (a FIFO, a directory): left alone
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not still_named(fd, self.dir_fd, entry):
                    continue  # its run published it (or removed it) since we opened it
            except OSError:
                continue  # a live run owns it
            else:
                unlink(self.dir_fd, entry)
            finally:
                os.close(fd)

    def _discard_earlier_partial(self) -> None:
        """Without ``--resume``: remove the partial file and journal an earlier
        ``--resume`` run left for this name, unless a live run holds the partial
        (its lock). That run's files were removed under it, and a third run could
        then create a new partial under the name, which the live run's rename
        published half-written (zeros where its parts were still missing)."""
        partial = self.base_partial()
        held: int | None = None
        if self.existing is None or partial in self.existing:
            try:
                held = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                               | getattr(os, "O_CLOEXEC", 0), dir_fd=self.dir_fd)
            except OSError:
                held = None  # absent, or a symlink: removed below, never followed
        try:
            if held is not None and stat.S_ISREG(os.fstat(held).st_mode):
                try:  # held while the names go: no run can take them over in between
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # a live --resume run's: left to it
                if not still_named(held, self.dir_fd, partial):
                    return  # published since it was opened, or a new live run's
            for leftover in (partial, self.journal):
                if self.existing is None or leftover in self.existing:
                    discard_leftover(self.dir_fd, leftover, strict=False)
        finally:
            if held is not None:
                os.close(held)

    def base_partial(self) -> str:
        return f"{temp_stem(self.name)}partial.tmp"

    def _load_journal(self) -> dict[int, str]:
        return load_journal(self.dir_fd, self.journal, self.tmp, self.identity, self.size,
                            self.part_size)

    def _remove_unless_live(self, name: str) -> None:
        """Remove the file under ``name`` unless a live run holds it (an error then)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                         | getattr(os, "O_CLOEXEC", 0), dir_fd=self.dir_fd)
        except FileNotFoundError:
            return
        except OSError:  # a symlink (ELOOP) or something unreadable
            discard_leftover(self.dir_fd, name)
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                lock_or_busy(fd, name)
                if not still_named(fd, self.dir_fd, name):
                    raise busy(name)  # published or replaced by a live run since it was opened
            discard_leftover(self.dir_fd, name)
        finally:
            os.close(fd)

    # -- writes (run in worker threads) ---------------------------------------
    @contextlib.contextmanager
    def _using_fd(self) -> Iterator[int]:
        with self._cond:
            if self._closed or self._fd is None:
                raise OSError("destination file already closed")
            self._active += 1
        try:
            yield self._fd
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[Callable[[int, memoryview], None]]:
        """``write(offset, data)`` (``pwrite``) for one part, in a worker thread;
        the descriptor is held for the whole part (one lock round per part, not
        per chunk: dozens of receiving threads would queue on it). Parts never
        overlap."""
        with self._using_fd():
            assert self.writes is not None
            yield self.writes.write

    def part_written(self, index: int, offset: int, length: int, digest: str | None) -> None:
        """Part ``index`` is whole in the file: start its writeback at once and,
        for ``--resume``, journal it with its sha256 (taken as it arrived)."""
        if _start_writeback is not None and self.durable and not self._went_direct(offset, length):
            with self._using_fd() as fd:
                _start_writeback(fd, offset, length)
        if digest is not None and self.resume:
            with self._done_lock:
                self.done[index] = digest
        self.maybe_checkpoint()

    def _went_direct(self, offset: int, length: int) -> bool:
        """Whether the part's bytes went to the disk directly (all but the
        object's unaligned last bytes, which the fsync writes out)."""
        w = self.writes
        return (w is not None and w.direct and offset % ALIGN == 0
                and (length % ALIGN == 0 or offset + length == self.size))

    def maybe_checkpoint(self, force: bool = False) -> None:
        """Persist the journal (data first: fdatasync, then the journal, atomically)."""
        if not self.resume:
            return
        # Writers do not queue behind a checkpoint in progress; only a forced one waits.
        if not self._checkpoint_lock.acquire(blocking=force):
            return
        try:
            now = time.monotonic()
            if not force and now - self._last_checkpoint < _CHECKPOINT_SECONDS:
                return
            self._last_checkpoint = now
            with self._done_lock:  # snapshot first: only parts already pwritten
                parts = {str(k): v for k, v in sorted(self.done.items())}
            with self._using_fd() as fd:
                os.fdatasync(fd)
            write_journal(self.dir_fd, self.journal, self.identity, parts)
        finally:
            self._checkpoint_lock.release()

    def sha256(self) -> str:
        """sha256 of the whole temp file, read in order (to compare with a checksum
        the source stored)."""
        h = hashlib.sha256()
        view = memoryview(bytearray(_HASH_CHUNK))
        with self._using_fd() as fd:
            pos = 0
            while pos < self.size:
                n = min(_HASH_CHUNK, self.size - pos)
                _read_exact(fd, view[:n], pos)
                h.update(view[:n])
                pos += n
        return h.hexdigest()

    def verify_part(self, index: int, expected: str, buf: PartBuffer) -> None:
        """Read a part written by an earlier run back and compare its journal digest."""
        start, end = plan_parts(self.size, self.part_size)[index]
        view = memoryview(buf)[: end - start]
        with self._using_fd() as fd:
            _read_exact(fd, view, start)
        if digest(view) != expected:
            raise IntegrityError(
                f"verification failed: bytes {start}-{end - 1} differ from the source"
            )

    def publish(self) -> None:
        """Check the size, set normal permissions, fsync (``durable``), rename over the
        destination, fsync the directory (``durable``)."""
        with self._using_fd() as fd:
            got = os.fstat(fd).st_size
            if got != self.size:
                raise IntegrityError(
                    f"verification failed: the file has {got} bytes, the source {self.size}")
            os.fchmod(fd, new_file_mode() if self.mode is None else self.mode)
            if self.mtime_ns is not None:
                lost = _give_date(fd, self.mtime_ns)
                if lost is not None and self.on_date_lost is not None:
                    self.on_date_lost(lost)
            if self.durable:
                os.fsync(fd)
            # Renamed while the descriptor (and so the lock) is held: once it is
            # let go, another run's scan takes the temp file for a dead run's.
            os.replace(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            self._published = True
            if self.resume:  # else the journal, if any, is a live --resume run's
                unlink(self.dir_fd, self.journal)
        self._close_fd()
        if self.durable:
            directory_sync.sync(self.dir_fd)

    def _close_fd(self) -> None:
        # Wait for worker threads still using the descriptor: closing it under
        # them could let a reused descriptor number receive their writes.
        with self._cond:
            self._closed = True
            while self._active:
                self._cond.wait()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self.writes is not None:
            self.writes.close()

    def abort(self, *, keep_for_resume: bool) -> None:
        """Drop the temp file, or keep it with an up-to-date journal for ``--resume``."""
        if self._published:
            return
        if keep_for_resume and self.resume and self._fd is not None:
            with contextlib.suppress(OSError):
                self.maybe_checkpoint(force=True)
            self._close_fd()
            return
        # The names go while the lock is held: once it is let go, the fixed
        # names of --resume may be a new run's by the time they are removed.
        unlink(self.dir_fd, self.tmp)
        if self.resume:
            unlink(self.dir_fd, self.journal)
            unlink(self.dir_fd, self.journal[: -len(".tmp")] + ".new.tmp")
        self._close_fd()
