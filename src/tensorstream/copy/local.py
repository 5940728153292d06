"""``cp`` into a local directory: parts received straight into a temp file.

One object's life, as seen from the event loop, is a handful of hops to the
data plane's worker threads (:func:`~tensorstream.providers._http.threads.in_thread`):

1. *prepare*: open the destination directory (component by component, never
   following a symlink), check the free space, create (or reopen, for
   ``--resume``) the temp file;
2. one hop per part: the part's bytes go from the socket (or the source file)
   through the worker's 1 MiB chunk buffer into the temp file (``pwrite``);
3. *publish*: size check, fsync (``durable``), rename, fsync of the directory.

A durable copy writes its bytes with ``O_DIRECT`` where the filesystem allows
(:mod:`.direct`): they must reach the disk before the copy is reported anyway,
and a page-cache copy of them only costs fresh pages and a long fsync.

An object of one part (a folder of small files) does all three in **one**
hop when nothing needs the event loop in between: each hop is a wake-up of
the loop and of a thread, which on a busy 2-core machine costs more than
the syscalls themselves (measured: 100 x 4 MiB went from four hops per
object to one). From a ranged-stream source (HTTP(S), S3) such objects skip
the event loop altogether: the lane's threads (:mod:`.lane`) run each start
to end with the same steps (:class:`LocalCopy`).

Every destination directory is listed once per copy (:class:`Listings`), not
once per object: the listing finds temp files of earlier runs (space they
hold counts as free; unlocked ones are removed) and a folder of n objects
no longer costs n listings of a directory growing to n entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Collection
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, TypeVar

from .._umask import current_umask
from ..errors import IntegrityError
from ..providers._http.threads import in_thread
from ..providers.base import ObjectInfo, Pin
from .checks import RESUMABLE, STORED_MISMATCH, stored_sha256
from .keys import open_dir_under
from .part_file import LocalPartFile
from .receive import receive_part
from .select import notify
from .sinks import PartBuffer, plan_parts, temp_stem

if TYPE_CHECKING:
    from .copier import _Copier
    from .job import Job

__all__ = ["Listings", "LocalCopy", "check_free_space", "copy_to_local", "copied_mode", "mtime_ns",
           "stat_by_parts",
           "one_hop"]

T = TypeVar("T")
log = logging.getLogger("tensorstream.copy")


class Listings:
    """The names in each destination directory when the copy first wrote there.

    Temp files that appear later belong to live runs (this one included),
    which hold them locked, so a listing taken once stays good for deciding
    which temp files are stale."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}
        #: Whether a copy that did not keep its source's date was said (once a copy).
        self.date_lost_said = False

    def date_lost(self, label: str, why: str) -> None:
        """Say once a copy that a copy (``label``) does not carry its source's date
        (``why``): ``sync`` compares dates, so it will copy every such file again on
        every run; silent, it looked like a sync that never settles."""
        with self._lock:
            if self.date_lost_said:
                return
            self.date_lost_said = True
        log.warning("%s: copied, but its source's date could not be given to it (%s); "
                    "sync compares dates and will copy the files of this destination "
                    "again on every run (said once)", label, why)

    @functools.cached_property
    def umask(self) -> int:
        """The process's umask, read once per copy: reading it costs six system
        calls (``/proc/self/status``), each a hand-off of the interpreter lock
        between the copy's threads, and every file of the copy gets the same."""
        return current_umask()

    def names(self, key: tuple[str, tuple[str, ...]], dir_fd: int) -> frozenset[str]:
        with self._lock:  # listed under the lock: once, even when objects race to it
            found = self._names.get(key)
            if found is None:
                found = self._names[key] = frozenset(os.listdir(dir_fd))
            return found


def check_free_space(dir_fd: int, name: str, size: int, label: str,
                     listing: Collection[str] | None = None) -> None:
    """Refuse a copy the destination's filesystem cannot hold, before anything is
    planned or written (a source may claim any size: a HEAD saying 10**18 bytes).
    Space already held by a partial file from an earlier run counts as free."""
    st = os.statvfs(dir_fd)
    if st.f_blocks == 0:
        # The filesystem reports no size (ramfs, which grows as it is written;
        # /proc): 0 free is no measure. Every copy into ramfs was refused with
        # "not enough space"; what the writes meet (ENOSPC) is said as it comes.
        return
    free = st.f_bavail * st.f_frsize
    if size <= free:
        return  # the common case: no need to look for earlier partial files
    names = os.listdir(dir_fd) if listing is None else listing
    for temp in names:
        if temp.startswith(temp_stem(name)) and temp.endswith(".tmp"):
            with contextlib.suppress(OSError):
                free += os.stat(temp, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
    if size > free:
        raise OSError(errno.ENOSPC, f"not enough space for {label}: the source says "
                      f"{size} bytes, the destination has {free} free")


async def _received_in_slot(slots: asyncio.Semaphore, loop: asyncio.AbstractEventLoop,
                            prepare: Callable[[Callable[[], None]], T]) -> T:
    """``prepare(received)`` in a worker thread, holding one of ``slots`` (a read
    slot: a connection in flight) until the bytes are in, when the thread calls
    ``received()``; the rest of the hop (the publish: fsync, rename, the
    directory's fsync) runs without it, so the next object's GET starts while
    this one waits for the disk (a durable folder copy held its slots through
    every fsync: 100 x 4 MiB spent ~11% of its slot time there on loopback)."""
    await slots.acquire()
    handed_back = threading.Event()

    def received() -> None:
        if not handed_back.is_set():
            handed_back.set()
            loop.call_soon_threadsafe(slots.release)

    try:
        return await in_thread(lambda: prepare(received))
    finally:
        # in_thread returns (or raises) only once the thread has stopped, so
        # the slot is handed back exactly once, by one side or the other.
        if not handed_back.is_set():
            handed_back.set()
            slots.release()


def _open_target_dir(root: str, subdirs: list[str]) -> int:
    try:
        os.makedirs(root, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise OSError(exc.errno, f"the destination directory {root} cannot be made: a file "
                      "is in its way") from None
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        return open_dir_under(root_fd, subdirs)
    finally:
        os.close(root_fd)


def stat_by_parts(root: str, parts: list[str]) -> os.stat_result:
    """The stat of ``root/parts...`` reached a directory at a time, as the copy writes it
    (its whole path may be past PATH_MAX, which ``os.stat`` of it refuses: ``File name
    too long``); a symbolic link in the way raises, as it does for the copy."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = open_dir_under(root_fd, parts[:-1], create=False)
    finally:
        os.close(root_fd)
    try:
        return os.stat(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


class LocalCopy:
    """One object's copy into its local destination, in steps that the event
    loop (:func:`copy_to_local`) and the lane (:mod:`.lane`, a thread that runs
    objects of one part start to end) share.

    :meth:`prepare` (in a worker thread) opens the destination directory,
    checks the space and creates the temp file; for an object of one part
    (:attr:`one_hop`) it also receives the part and, when the answer named
    the source's version, publishes it. :meth:`finish` (on the event loop)
    does the rest. :meth:`fail` discards the temp file (keeping it for
    ``--resume`` when the copy was cut off) and :meth:`close` the directory."""

    def __init__(self, c: _Copier, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        assert job.local is not None
        self.c, self.job, self.loop = c, job, loop
        self.root, self.path_parts = job.local
        self.name = self.path_parts[-1]
        self.size = job.info.size
        self.parts = plan_parts(self.size, c.part_size)
        self.pin = Pin.of(job.info)
        self.stored = stored_sha256(job.info)
        #: Nothing needs the event loop between receiving and publishing an
        #: object of one part (unless it resumes, or a stored checksum must be
        #: compared first).
        self.one_hop = one_hop(c, job)
        self.sink: LocalPartFile | None = None
        self.dir_fd: int | None = None

    def receive(self, index: int) -> bool:
        """In a worker thread: the part's bytes go from the socket (or the source
        file) through a chunk buffer into the temp file. Returns whether every
        byte is known to be of the pinned version."""
        sink, job, progress = self.sink, self.job, self.c.progress
        assert sink is not None
        start, end = self.parts[index]
        hasher = hashlib.sha256() if sink.resume else None
        with sink.writing() as write:
            def deliver(offset: int, view: memoryview) -> None:
                write(offset, view)
                if hasher is not None:
                    hasher.update(view)
                if progress is not None:
                    # Byte-level progress (each chunk is delivered exactly once),
                    # so a slow link moves the bar before a whole part is in.
                    progress.advance(job.label, len(view))

            pinned = receive_part(job.src, job.src_path, start, end, self.pin, deliver,
                                  self.loop)
        sink.part_written(index, start, end - start,
                          hasher.hexdigest() if hasher is not None else None)
        return pinned

    def prepare(self, received: Callable[[], None] | None = None) -> tuple[int, bool | None]:
        """Directory, space, temp file; with :attr:`one_hop` the part and the
        publish too, calling ``received()`` in between. Returns (bytes resumed,
        whether the part was pinned or None)."""
        c, job, name = self.c, self.job, self.name
        self.dir_fd = dir_fd = _open_target_dir(self.root, self.path_parts[:-1])
        listing = c.listings.names((self.root, tuple(self.path_parts[:-1])), dir_fd)
        if name in listing and stat.S_ISDIR(
                os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            # before a byte is read: the rename at the end could not replace it
            raise IsADirectoryError(errno.EISDIR, f"{job.dst_label} is a directory; a file "
                                    "cannot take its place")
        check_free_space(dir_fd, name, self.size, job.dst_label, listing)
        target = LocalPartFile(dir_fd, name, size=self.size, part_size=c.part_size,
                               source=job.label, etag=job.info.etag, resume=c.resume,
                               durable=c.durable, direct=c.direct,
                               existing=listing, mtime_ns=mtime_ns(job.info),
                               mode=copied_mode(job.info, c.listings.umask),
                               on_date_lost=functools.partial(c.listings.date_lost,
                                                              job.dst_label))
        resumed = target.open()
        self.sink = target  # only a temp file this run opened (and locked) is ever aborted
        if not self.one_hop or not self.parts:
            return resumed, None
        pinned = self.receive(0)
        if received is not None:
            received()
        if pinned:
            self.sink.publish()
        return resumed, pinned

    async def finish(self, resumed: int, pinned: bool | None) -> int:
        """After :meth:`prepare`: the parts still missing, the checks, the
        publish. Returns the bytes resumed from an earlier run."""
        c, job, sink, parts = self.c, self.job, self.sink, self.parts
        progress = c.progress
        assert sink is not None
        if pinned:
            return 0  # received, tied to the source's version and published in one hop
        if resumed and progress:
            progress.advance(job.label, resumed)
        earlier = dict(sink.done)  # parts from an interrupted run: checked at the end
        # Parts of an earlier run, or an answer that did not name its version:
        # the source must be checked again after the copy.
        unconfirmed = bool(earlier) or pinned is False

        async def part(index: int) -> None:
            nonlocal unconfirmed
            if not await in_thread(lambda: self.receive(index)):
                unconfirmed = True

        async def check_earlier(index: int, buf: PartBuffer, length: int) -> None:
            try:
                await asyncio.to_thread(sink.verify_part, index, earlier[index], buf)
            except BaseException:
                c.pool.drop(buf)
                raise
            c.pool.put(buf)

        if pinned is None:
            # Lazily: a source may claim any size (parts are never one big list).
            todo = (i for i in range(len(parts)) if i not in sink.done)
            await c._run_parts(todo, part)
        if unconfirmed or len(sink.done) >= len(parts):
            # Some answer did not name the version it came from: the source
            # must still be the version it was when the copy started.
            await c._check_source_unchanged(job)
        if c.verify and earlier:
            notify(progress, "phase", job.label, "verifying")
            await c._each_part(sorted(earlier), parts, check_earlier)
        if self.stored is not None:
            # The source keeps a checksum of its bytes (a Redis manifest): the
            # one comparison that also covers damage at the source, and parts
            # taken from an earlier run.
            notify(progress, "phase", job.label, "verifying")
            if await in_thread(sink.sha256) != self.stored:
                raise IntegrityError(STORED_MISMATCH)
            job.source_checked = True
        await in_thread(sink.publish)
        return resumed

    def fail(self, exc: BaseException) -> None:
        """Discard the temp file: kept (for ``--resume``) only when the copy was
        interrupted or cut off; a verification failure or a changed source
        starts over."""
        sink, job, parts = self.sink, self.job, self.parts
        if sink is None:
            return
        keep = isinstance(exc, RESUMABLE)
        sink.abort(keep_for_resume=keep)
        if keep and sink.resume:
            kept = sum(parts[i][1] - parts[i][0] for i in sink.done)
            job.kept = (os.path.join(os.path.dirname(job.dst_path), sink.base_partial()), kept)

    def close(self) -> None:
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None

    def abandon(self, exc: BaseException) -> None:
        """The copy ended with ``exc``: :meth:`fail`, then :meth:`close`."""
        try:
            self.fail(exc)
        finally:
            self.close()

    async def complete(self, resumed: int, pinned: bool | None) -> int:
        """:meth:`finish`, abandoning the copy if it raises; closes either way."""
        try:
            return await self.finish(resumed, pinned)
        except BaseException as exc:
            self.fail(exc)
            raise
        finally:
            self.close()


def copied_mode(info: ObjectInfo, umask: int) -> int:
    """The permissions of a copy: a local source's own less the umask, as ``cp``
    (and ``rsync``, ``shutil.copy``) give it (a private file (0600) was copied
    0644, readable by every user); 0666 less the umask for a source without
    permissions (not a local file), as every new file gets."""
    mode = (info.extra or {}).get("mode")
    if not isinstance(mode, int) or isinstance(mode, bool):
        return 0o666 & ~umask
    return mode & 0o777 & ~umask


def mtime_ns(info: ObjectInfo) -> int | None:
    """The source's modification time in ns since the epoch (exact to its
    microsecond), for the local copy to carry, as ``aws s3 cp`` and rclone do:
    ``sync`` then compares the source's date with the one it had at the copy.
    With the copy's own time, a same-size update dated before that time (a
    source clock behind this machine's, S3's and HTTP's whole seconds, an upload
    begun before the copy) was taken as "unchanged" for ever."""
    when = info.mtime
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def one_hop(c: _Copier, job: Job) -> bool:
    """Whether ``job`` is received and published in one step of a worker thread:
    one part, to a local file, no ``--resume`` and no stored checksum to compare."""
    return (job.local is not None and 0 < job.info.size <= c.part_size and not c.resume
            and stored_sha256(job.info) is None)


async def copy_to_local(c: _Copier, job: Job) -> int:
    """Copy ``job`` into its local destination; returns the bytes resumed from an
    earlier run. Raises on failure, leaving nothing under the destination's name
    (a ``--resume`` copy that was cut off keeps its hidden partial file)."""
    op = LocalCopy(c, job, asyncio.get_running_loop())
    try:
        if op.one_hop:
            resumed, pinned = await _received_in_slot(c.read_slots, op.loop, op.prepare)
        else:
            resumed, pinned = await in_thread(op.prepare)
    except BaseException as exc:
        op.abandon(exc)
        raise
    return await op.complete(resumed, pinned)
