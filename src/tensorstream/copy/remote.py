"""``cp`` into a remote destination (S3, Redis, any provider's writer).

Writers that take parts in any order (:meth:`~tensorstream.providers.base.Writer.write_part`:
S3 and Redis) get each part as soon as it is in: parts are read
concurrently into buffers of a bounded pool, the MD5 of each is taken as its
bytes arrive (chunk by chunk, on the receiving thread), and the part is
uploaded at once, concurrently with the others. The service then vouches for
what it stored, compared with those digests (S3: ``Content-MD5`` checked by
S3, and the part and object ETags; Redis: every staged chunk present at its
exact length when the manifest is published; see the writers), so the
destination is **not read back**. Memory: the pool, ``(concurrency + spare)
x part size``, whatever the object size; a part's buffer goes back to the
pool when its upload is done.

Other writers get the parts in order (:class:`~.sinks.SequentialSink`) and the
destination is read back after commit and compared with the sha256 of every
part taken as it arrived: a destination that takes any bytes it is given
says nothing about them.

Either way the answers are pinned to the version the copy started from, the
source is checked again where an answer did not name its version, and a
checksum the source stored (a Redis manifest's sha256) is compared with the
bytes before anything is published.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, NotFoundError
from ..providers._http.threads import in_thread
from ..providers.base import Pin, Writer
from .checks import STORED_MISMATCH, stored_sha256
from .metadata import writer_options
from .receive import receive_part
from .select import notify
from .sinks import BufferPool, PartBuffer, SequentialSink, digest, plan_parts
from .source_layout import source_part_size
from .tasks import cancel_and_wait, gather_or_cancel

MiB, GiB = 1 << 20, 1 << 30

if TYPE_CHECKING:
    from .copier import _Copier
    from .job import Job

__all__ = ["InOrderHash", "copy_to_writer"]


class InOrderHash:
    """The sha256 of parts that arrive in any order, fed in order: part ``i``
    waits until parts ``0..i-1`` are hashed (its buffer is held until then; a
    part holds its buffer before it starts, so this always moves on)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._next = 0
        self._turn = asyncio.Condition()

    async def feed(self, index: int, data: memoryview) -> None:
        async with self._turn:
            await self._turn.wait_for(lambda: self._next == index)
        await in_thread(lambda: self._hash.update(data))  # hashlib drops the GIL
        async with self._turn:
            self._next += 1
            self._turn.notify_all()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


async def copy_to_writer(c: _Copier, job: Job) -> int:
    """Copy ``job`` to its remote destination (nothing appears unless whole and
    checked); returns 0 (remote copies do not resume)."""
    writer = job.dst.open_writer(job.dst_path, **await writer_options(c, job))
    # S3 to S3: the source's own parts where S3 tells them, so that the copy's ETag is
    # the source's (sync compares them); at most --part-size (the pool's buffers).
    follow = await source_part_size(job, c.part_size)
    part_size = writer.part_size_for(job.info.size, follow or c.part_size)
    if part_size is None:
        return await _in_order(c, job, writer)
    if part_size > c.part_size:  # (their pools, each up to 2 GiB, one at a time)
        async with c.large_parts:
            return await _by_parts(c, job, writer, part_size)
    return await _by_parts(c, job, writer, part_size)


async def _read_parts(c: _Copier, job: Job, pool: BufferPool, todo: Iterable[int],
                      fill: Callable[[int, PartBuffer], Any],
                      consume: Callable[[int, PartBuffer, int], Any],
                      parts: Sequence[tuple[int, int]]) -> None:
    """Parts read concurrently into ``pool`` buffers by ``fill(index, buf)`` (under
    the copy's shared read limit); then ``consume(index, buf, length)`` owns the
    buffer. The first failure stops the object."""
    pending: set[asyncio.Task[None]] = set()
    unstarted: dict[int, PartBuffer] = {}  # buffers of tasks that have not run yet

    async def part(index: int) -> None:
        buf = unstarted.pop(index)
        start, end = parts[index]
        try:
            async with c.read_slots:  # shared by all objects being copied
                await fill(index, buf)
        except BaseException:
            pool.drop(buf)  # a worker thread may still write into it
            raise
        await consume(index, buf, end - start)

    try:
        for index in todo:
            unstarted[index] = await pool.get()
            task = asyncio.create_task(part(index))
            pending.add(task)
            await asyncio.sleep(0)  # let it send its request before the next one
            for t in [t for t in pending if t.done()]:
                pending.discard(t)
                t.result()
        await asyncio.gather(*pending)
        pending.clear()
    finally:
        await cancel_and_wait(pending)
        for buf in unstarted.values():  # cancelled before they ran: untouched
            pool.put(buf)


async def _by_parts(c: _Copier, job: Job, writer: Writer, part_size: int) -> int:
    size = job.info.size
    parts = plan_parts(size, part_size)
    # (parts no larger than --part-size, a source's own: in the copy's pool's buffers)
    pool = c.pool if part_size <= c.part_size else c.pool_for(part_size)
    if pool.count < c.pool.count:
        c.result.notes.append(
            f"{job.dst_label}: {len(parts)} parts of {part_size / MiB:.0f} MiB (S3 takes at "
            f"most 10,000), {pool.count} at once to bound their buffers at "
            f"{pool.count * part_size / GiB:.1f} GiB (more: raise --concurrency or "
            "--part-size)")
    pin = Pin.of(job.info)
    loop = asyncio.get_running_loop()
    progress = c.progress
    stored = stored_sha256(job.info)
    ordered = InOrderHash() if writer.wants_sha256 or stored is not None else None
    md5s: dict[int, bytes] = {}
    unconfirmed = False

    async def fill(index: int, buf: PartBuffer) -> None:
        nonlocal unconfirmed
        start, end = parts[index]
        view = memoryview(buf)
        md5 = hashlib.md5()

        def receive() -> bool:
            # In a worker thread: each chunk lands at its place in the part
            # buffer and is hashed while it is still in the cache.
            def deliver(offset: int, chunk: memoryview) -> None:
                at = offset - start
                view[at: at + len(chunk)] = chunk
                md5.update(chunk)
                if progress is not None:
                    progress.advance(job.label, len(chunk))

            return receive_part(job.src, job.src_path, start, end, pin, deliver, loop)

        if not await in_thread(receive):
            unconfirmed = True
        md5s[index] = md5.digest()

    async def consume(index: int, buf: PartBuffer, length: int) -> None:
        view = memoryview(buf)[:length]
        try:
            steps = [writer.write_part(index, view, md5=md5s.pop(index))]
            if ordered is not None:
                steps.append(ordered.feed(index, view))
            # A failed upload stops the hashing too (it would wait for its turn forever).
            await gather_or_cancel(steps)
        except BaseException:
            pool.drop(buf)  # an upload cut short may still be sending from it
            raise
        pool.put(buf)

    try:
        await _read_parts(c, job, pool, range(len(parts)), fill, consume, parts)
        if unconfirmed or not parts:
            # Some answer did not name the version it came from: the source
            # must still be the version it was when the copy started.
            await c._check_source_unchanged(job)
        if stored is not None and ordered is not None:
            if ordered.hexdigest() != stored:  # before anything is published
                raise IntegrityError(STORED_MISMATCH)
            job.source_checked = True
        await writer.commit_parts(len(parts),
                                  sha256=ordered.hexdigest() if ordered is not None else None)
        job.published = True
    except BaseException:
        await asyncio.shield(writer.abort())
        raise
    if not c.verify:
        c.result.verified = False
    return 0


async def _in_order(c: _Copier, job: Job, writer: Writer) -> int:
    """A writer that only appends: parts in order, the destination read back."""
    size = job.info.size
    parts = plan_parts(size, c.part_size)
    expected: dict[int, str] = {}
    stored = stored_sha256(job.info)
    sink = SequentialSink(writer, c.pool, sha256=stored is not None)
    pin = Pin.of(job.info)

    async def fill(index: int, buf: PartBuffer) -> None:
        start, end = parts[index]
        await job.src.readinto(job.src_path, start, memoryview(buf)[: end - start], pin=pin)
        if c.progress:
            c.progress.advance(job.label, end - start)

    async def consume(index: int, buf: PartBuffer, length: int) -> None:
        expected[index] = await asyncio.to_thread(digest, memoryview(buf)[:length])
        sink.deliver(index, buf, length)

    committed = False
    try:
        reader = asyncio.create_task(
            _read_parts(c, job, c.pool, range(len(parts)), fill, consume, parts))
        drain = asyncio.create_task(sink.run(len(parts)))
        try:
            # Either side failing stops both (a dead writer must not leave
            # readers waiting forever for buffers it will never return).
            done, _ = await asyncio.wait({reader, drain}, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()
        finally:
            await cancel_and_wait((reader, drain))
            sink.release_all()
        await job.src.stat_pinned(job.src_path, pin)
        if stored is not None and sink.hash is not None:
            if sink.hash.hexdigest() != stored:  # before anything is published
                raise IntegrityError(STORED_MISMATCH)
            job.source_checked = True
        await writer.commit()
        committed = job.published = True
        if c.verify:
            notify(c.progress, "phase", job.label, "verifying")
            await _verify_by_reading_back(c, job, parts, expected)
        else:
            c.result.verified = False
    except BaseException:
        if not committed:
            await asyncio.shield(writer.abort())
        raise
    return 0


async def _verify_by_reading_back(c: _Copier, job: Job, parts: Sequence[tuple[int, int]],
                                  expected: dict[int, str]) -> None:
    info = await job.dst.stat(job.dst_path)
    bad = info.size != job.info.size
    listener = c.progress
    if not bad:
        got: dict[int, str] = {}
        back = dataclasses.replace(job, src=job.dst, src_path=job.dst_path, info=info)

        async def fill(index: int, buf: PartBuffer) -> None:
            start, end = parts[index]
            await back.src.readinto(back.src_path, start, memoryview(buf)[: end - start],
                                    pin=Pin.of(info))

        async def check(index: int, buf: PartBuffer, length: int) -> None:
            got[index] = await asyncio.to_thread(digest, memoryview(buf)[:length])
            c.pool.put(buf)
            notify(listener, "verified", job.label, length)

        # Read the destination back with the same machinery, same parts (not
        # counted as copy progress: check() reports it as verified bytes).
        await _read_parts(c, back, c.pool, range(len(parts)), fill, check, parts)
        bad = got != expected
    if bad:
        try:
            await job.dst.delete(job.dst_path)
        except NotFoundError:
            pass  # gone already
        except Exception as exc:  # still there: saying "removed" would be a lie
            raise IntegrityError(
                "verification failed: the destination differs from the source, and it "
                f"could not be removed ({exc}): remove it before using it") from exc
        job.published = False
        raise IntegrityError("verification failed: the destination differs from the "
                             "source; it was removed")
