"""Where ``cp`` puts parts: a positional local file or any provider's writer.

:class:`LocalPartFile` writes parts in whatever order they arrive with
``os.pwrite`` into a temp file beside the destination (opened through a
directory descriptor, so symlinks are never followed), keeps a small resume
journal when asked, verifies the temp file before publishing it, and
publishes with fsync + rename. :class:`SequentialSink` feeds any provider's
atomic :class:`~tensorstream.providers.base.Writer` in order, holding early
parts in a window bounded by the shared buffer pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator

from .errors import IntegrityError
from .providers.base import Writer

__all__ = ["BufferPool", "LocalPartFile", "SequentialSink", "digest", "plan_parts"]

_MARK = ".tensorstream-"
JOURNAL_VERSION = 1
_CHECKPOINT_SECONDS = 1.0


def digest(data: memoryview | bytes) -> str:
    """Checksum of one part (sha256: hardware-accelerated, releases the GIL)."""
    return hashlib.sha256(data).hexdigest()


def plan_parts(size: int, part_size: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every part of a ``size``-byte object."""
    return [(s, min(s + part_size, size)) for s in range(0, size, part_size)]


class BufferPool:
    """At most ``count`` part buffers of ``size`` bytes, reused between parts.

    This is what bounds ``cp``'s memory. A buffer whose part was cancelled
    may still be written by a worker thread, so it is dropped, never reused.
    """

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self._count = count
        self._allocated = 0
        self._free: asyncio.Queue[bytearray] = asyncio.Queue()

    async def get(self) -> bytearray:
        if self._free.empty() and self._allocated < self._count:
            self._allocated += 1
            return bytearray(self.size)
        return await self._free.get()

    def put(self, buf: bytearray) -> None:
        self._free.put_nowait(buf)

    def drop(self, buf: bytearray) -> None:
        """Retire ``buf`` (still in use by a thread) and put a fresh one in its place,
        which also wakes a waiter."""
        self._free.put_nowait(bytearray(self.size))


class LocalPartFile:
    """Positional writes into a temp file in ``dir_fd``, published as ``name``.

    With ``resume=True`` the temp file and a journal (source identity and the
    digests of completed parts) have fixed hidden names, survive an
    interruption, and are picked up by the next ``resume=True`` run if the
    source is unchanged.
    """

    def __init__(self, dir_fd: int, name: str, *, size: int, part_size: int,
                 source: str, etag: str | None, resume: bool) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.size = size
        self.part_size = part_size
        self.identity = {"v": JOURNAL_VERSION, "source": source, "size": size,
                         "etag": etag, "part_size": part_size}
        self.resume = resume and etag is not None
        base = f".{name}{_MARK}"
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
        else:
            self._unlink(self.base_partial())
            self._unlink(self.journal)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | os.O_NOFOLLOW
        if not self.done:
            flags |= os.O_TRUNC
        self._fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dir_fd)
        os.ftruncate(self._fd, self.size)
        return sum(min(self.part_size, self.size - i * self.part_size) for i in self.done)

    def base_partial(self) -> str:
        return f".{self.name}{_MARK}partial.tmp"

    def _load_journal(self) -> dict[int, str]:
        try:
            fd = os.open(self.journal, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.dir_fd)
            with os.fdopen(fd, "rb") as f:
                data = json.loads(f.read(1 << 24))
            st = os.stat(self.tmp, dir_fd=self.dir_fd, follow_symlinks=False)
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("identity") != self.identity:
            return {}  # the source changed (or other settings): start over
        if st.st_size != self.size:
            return {}
        parts = data.get("parts", {})
        return {int(k): str(v) for k, v in parts.items()} if isinstance(parts, dict) else {}

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.dir_fd)

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

    def write_part(self, index: int, offset: int, data: memoryview) -> str:
        """pwrite ``data`` at ``offset``; returns the part's digest."""
        d = digest(data)
        with self._using_fd() as fd:
            view = data
            pos = offset
            while view:
                n = os.pwrite(fd, view, pos)
                view = view[n:]
                pos += n
        with self._done_lock:
            self.done[index] = d
        return d

    def maybe_checkpoint(self, force: bool = False) -> None:
        """Persist the journal (data first: fdatasync, then the journal, atomically)."""
        if not self.resume:
            return
        with self._checkpoint_lock:
            now = time.monotonic()
            if not force and now - self._last_checkpoint < _CHECKPOINT_SECONDS:
                return
            self._last_checkpoint = now
            with self._done_lock:  # snapshot first: only parts already pwritten
                parts = {str(k): v for k, v in sorted(self.done.items())}
            with self._using_fd() as fd:
                os.fdatasync(fd)
            self._write_journal(parts)

    def _write_journal(self, parts: dict[str, str]) -> None:
        body = json.dumps({"identity": self.identity, "parts": parts})
        new = self.journal[: -len(".tmp")] + ".new.tmp"
        jfd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600,
                      dir_fd=self.dir_fd)
        with os.fdopen(jfd, "wb") as f:
            f.write(body.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(new, self.journal, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    def verify(self, expected: dict[int, str], buf: bytearray) -> None:
        """Read the temp file back and compare every part's digest."""
        with self._using_fd() as fd:
            os.fsync(fd)
            for index, (start, end) in enumerate(plan_parts(self.size, self.part_size)):
                view = memoryview(buf)[: end - start]
                got = 0
                while got < len(view):
                    n = os.preadv(fd, [view[got:]], start + got)
                    if n == 0:
                        raise IntegrityError(f"destination is short at byte {start + got}")
                    got += n
                if digest(view) != expected.get(index):
                    raise IntegrityError(
                        f"verification failed: bytes {start}-{end - 1} differ from the source"
                    )

    def publish(self) -> None:
        """fsync, set normal permissions, rename over the destination, fsync the directory."""
        with self._using_fd() as fd:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
            os.fsync(fd)
        self._close_fd()
        os.replace(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self._published = True
        self._unlink(self.journal)
        with contextlib.suppress(OSError):
            os.fsync(self.dir_fd)

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

    def abort(self, *, keep_for_resume: bool) -> None:
        """Drop the temp file, or keep it with an up-to-date journal for ``--resume``."""
        if self._published:
            return
        if keep_for_resume and self.resume and self._fd is not None:
            with contextlib.suppress(OSError):
                self.maybe_checkpoint(force=True)
            self._close_fd()
            return
        self._close_fd()
        self._unlink(self.tmp)
        self._unlink(self.journal)
        self._unlink(self.journal[: -len(".tmp")] + ".new.tmp")


class SequentialSink:
    """Feed parts that complete out of order to a sequential writer, in order."""

    def __init__(self, writer: Writer, pool: BufferPool) -> None:
        self.writer = writer
        self.pool = pool
        self._ready: dict[int, tuple[bytearray, int]] = {}
        self._next = 0
        self._changed = asyncio.Event()

    def deliver(self, index: int, buf: bytearray, length: int) -> None:
        """Hand over a finished part (the sink now owns ``buf``)."""
        self._ready[index] = (buf, length)
        self._changed.set()

    async def run(self, count: int) -> None:
        """Write parts ``0..count-1`` in order as they become ready."""
        while self._next < count:
            while self._next not in self._ready:
                self._changed.clear()
                await self._changed.wait()
            buf, length = self._ready.pop(self._next)
            try:
                # A copy: a writer may keep the data after write() returns.
                await self.writer.write(bytes(memoryview(buf)[:length]))
            finally:
                self.pool.put(buf)
            self._next += 1

    def release_all(self) -> None:
        for buf, _ in self._ready.values():
            self.pool.put(buf)
        self._ready.clear()
