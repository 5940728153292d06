"""Atomic S3 writes: one PUT for small objects, a concurrent multipart upload for
large ones, aborted on any failure or cancellation (no orphaned parts): no part starts
after a failure, and the parts already sent are waited for before the abort (S3 stores a
part whose request it has, and one stored after the abort would be left behind).

Memory is bounded: parts of at most ``max_in_flight`` x the first part's size
are uploading while one more fills. A streaming write's parts grow (see
:mod:`.parts`); a grown part counts as that many first parts, but at least a
quarter of ``max_in_flight`` parts always go at once (a lone part would go at
one connection's speed). The object appears only when ``CompleteMultipartUpload`` (or the single
PUT) succeeds.

Parts in any order (``cp``): :meth:`S3Writer.write_part` uploads part ``i`` as
part number ``i + 1`` at once, concurrently with the others, with the
``Content-MD5`` of the source's bytes: S3 refuses a part whose bytes do not
match it (``BadDigest``), and the part's ``ETag`` it answers, where it is an
MD5 (not under SSE-KMS/SSE-C), must equal it as well; the object's ETag after
``CompleteMultipartUpload`` must be the MD5 of those MD5s, ``-N``. That is
the service's own statement about the bytes it stored, compared with digests
taken from the source: nothing is read back.

Abort is final. The request that publishes (``PutObject``,
``CompleteMultipartUpload``) is not cancelled once sent -- S3 finishes a
request it received even when the client hangs up -- but runs to its answer
as a task, which :meth:`S3Writer.abort` waits for: if it published, the abort
removes the object again; a commit stopped meanwhile never reports success.
The publish, its checks and its undoing are in :mod:`.publish`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ... import _loop
from ...config import RetryConfig
from ...errors import (
    IntegrityError,
    NotFoundError,
    ProtocolError,
    TensorstreamError,
    UnsupportedOperationError,
)
from ...layers.resend import sent_again
from .aborts import abort_again, not_aborted
from .cleanup import delete_written
from .etags import KMS_ENCRYPTION
from .lost_upload import abort_lost_upload, may_have_made_one
from .part_tasks import drain
from .parts import (
    GROW_EVERY,
    MAX_OBJECT_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    check_object_size,
    known_size_part,
    streaming_part_size,
)
from .publish import Publishing
from .tags import header_or_later, put_later

__all__ = ["KMS_ENCRYPTION", "MIN_PART_SIZE", "S3Writer"]

log = logging.getLogger("tensorstream.s3")

#: The abort's own retries (3 attempts, short waits: it runs while a failed
#: copy is being cleaned up).
_ABORT_RETRY = RetryConfig(attempts=3, backoff_initial=0.05, backoff_max=1.0)


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over a memoryview: how a part's bytes go to
    botocore (which takes bytes, bytearray or a file) without copying them."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), len(self._view) - self._pos))
        memoryview(buffer).cast("B")[:n] = self._view[self._pos: self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


class S3Writer(Publishing):
    """Writer for one S3 object. ``call(op, **kwargs)`` runs a client operation
    and raises tensorstream errors (the provider maps them)."""

    #: Parts per upload (S3's limit), and parts between doublings of a streaming
    #: write's part size: tests lower them to reach both with a few parts.
    max_parts: int = MAX_PARTS
    grow_every: int = GROW_EVERY
    #: Bytes S3 stores in one object (a test lowers it too).
    max_object_size: int = MAX_OBJECT_SIZE

    def __init__(
        self,
        call: Callable[..., Awaitable[dict[str, Any]]],
        bucket: str,
        key: str,
        *,
        part_size: int,
        max_in_flight: int,
        checksum: bool,
        retry: RetryConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self._call = call
        #: Content-Type, user metadata, ... sent with the upload (:mod:`.metadata`); tags
        #: too long for its header are set once it is published (:mod:`.tags`).
        self._metadata, self._tags_later = header_or_later(dict(metadata or {}))
        #: Attempts of each UploadPart and of the PutObject (None: one): sent again whole.
        self._retry = retry
        self._bucket = bucket
        self._key = key
        self._part_size = max(part_size, MIN_PART_SIZE)
        self._max_in_flight = max(1, max_in_flight)
        self._checksum = checksum
        self._buf = bytearray()
        self._part_number = 0
        self._sent = 0  # bytes of the parts started
        self._upload_id: str | None = None
        self._create: asyncio.Task[dict[str, Any]] | None = None
        self._create_sent = self._create_answered = 0.0
        #: Tries of the CreateMultipartUpload that may have made an upload unanswered:
        #: each one's (sent, failed), ``time.time()``.
        self._create_lost: list[tuple[float, float]] = []
        self._tasks: list[asyncio.Task[None]] = []
        #: write_part's uploads still running: each runs to its answer as a task, which an
        #: abort waits for (a part S3 has lands whether its client hung up or not).
        self._in_flight: set[asyncio.Future[None]] = set()
        self._parts: dict[int, dict[str, Any]] = {}
        self._part_sizes: dict[int, int] = {}
        #: What S3 answered names no encryption under which its ETags are not MD5s.
        self._etags_are_md5 = True
        self._slots: asyncio.Semaphore | None = None
        self._error: BaseException | None = None
        self._abort_task: asyncio.Task[None] | None = None
        #: The request that publishes, once sent (see _publish).
        self._publish_job: asyncio.Future[dict[str, Any]] | None = None
        self._state = "open"
        #: write_part: the first part, held until a second one shows it is not the only.
        self._only: tuple[bytes, bytes] | None = None
        #: The size given says there are several parts: none is held as maybe the only one
        #: (a copy of it in memory, beside the caller's buffers: 525 MiB of a 5 TiB object).
        self._several = False
        self._md5s: dict[int, bytes] = {}

    def __repr__(self) -> str:
        return f"S3Writer({self._bucket}/{self._key}, parts={self._part_number}, {self._state})"

    def _next_part_size(self) -> int:
        return streaming_part_size(self._part_number, self._part_size, self.grow_every)

    def _weight(self, size: int) -> int:
        """Slots a part of ``size`` bytes takes: one per first-part size, but
        never so many that fewer than a quarter of the slots' parts go at once."""
        quarter = max(1, self._max_in_flight // 4)
        return max(1, min(size // self._part_size, self._max_in_flight // quarter))

    # -- Writer ---------------------------------------------------------------
    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._check_open()
        try:
            view = memoryview(data).cast("B")
            while view:
                size = self._next_part_size()
                room = size - len(self._buf)
                self._buf += view[:room]
                view = view[room:]
                if len(self._buf) >= size:
                    part, self._buf = self._buf, bytearray()
                    await self._start_part(part)
        except BaseException:
            await self.abort()
            raise

    async def commit(self) -> None:
        if self._state == "committed":
            return
        self._check_open()
        try:
            if self._create is None:
                body, self._buf = bytes(self._buf), bytearray()
                resp = await self._put(body)
            else:
                if self._buf:
                    part, self._buf = self._buf, bytearray()
                    await self._start_part(part)
                await asyncio.gather(*self._tasks)
                if self._error is not None:
                    raise self._error
                parts = [self._parts[n] for n in range(1, self._part_number + 1)]
                # botocore turns a 200 whose body is an <Error> into a ClientError here.
                resp = await self._complete(parts)
            self._state = "committed"
            await self._set_tags_later(resp)
        except BaseException:
            await self.abort()
            raise

    async def abort(self) -> None:
        if self._state in ("committed",):
            return
        self._state = "aborted"
        self._buf = bytearray()
        self._only = None
        if self._abort_task is None:
            self._abort_task = asyncio.ensure_future(self._abort_remote())
        # Shielded: cleanup finishes even if the caller is being cancelled.
        await asyncio.shield(self._abort_task)

    # -- parts in any order ------------------------------------------------------
    def part_size_for(self, total: int, wanted: int) -> int | None:
        # S3: at least 5 MiB (all parts but the last), at most 10,000 parts, 5 TiB.
        check_object_size(total, f"{self._bucket}/{self._key}")
        part = known_size_part(total, wanted, self.max_parts)
        self._several = total > part  # (then the first part is not held: see write_part)
        return part

    async def write_part(self, index: int, data: memoryview, *, md5: bytes) -> None:
        if self._state != "open" and self._error is not None:
            raise self._error  # parts run concurrently: the one that failed first says why
        self._check_open()
        if (index == 0 and not self._several and not self._parts and self._create is None
                and self._only is None):
            # Maybe the only part: kept for one PUT at commit (nothing appears
            # before then); a second part turns it into a multipart upload.
            self._only = (bytes(data), md5)
            return
        try:
            await self._ensure_upload()
            self._check_open()  # (aborted meanwhile: its parts in flight are being waited for)
            parts = [self._part_task(index + 1, data, md5)]
            if self._only is not None:
                first, self._only = self._only, None
                parts.append(self._part_task(1, first[0], first[1]))
            # Shielded: a caller cancelled (another part failed, Ctrl-C) leaves the
            # upload to its answer, and abort() waits for it before aborting.
            await asyncio.shield(asyncio.gather(*parts))
        except BaseException as exc:
            if self._error is None and not isinstance(exc, asyncio.CancelledError):
                self._error = exc
            await self.abort()
            raise

    def _part_task(self, number: int, data: bytes | memoryview, md5: bytes
                   ) -> asyncio.Future[None]:
        task = asyncio.ensure_future(self._put_part(number, data, md5))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return task

    async def commit_parts(self, count: int, *, sha256: str | None = None) -> None:
        if self._state == "committed":
            return
        self._check_open()
        try:
            if self._create is None:
                body, md5 = self._only if self._only is not None else (b"", hashlib.md5().digest())
                self._only = None
                resp = await self._put(body, md5)
                await self._check_published(resp, md5.hex(), None)
            else:
                if sorted(self._parts) != list(range(1, count + 1)):
                    raise IntegrityError(
                        f"{len(self._parts)} of {count} parts were uploaded; nothing was published")
                parts = [self._parts[n] for n in range(1, count + 1)]
                resp = await self._complete(parts)
                whole = hashlib.md5(b"".join(self._md5s[n] for n in range(1, count + 1)))
                await self._check_published(resp, whole.hexdigest(), count)
            self._state = "committed"
            await self._set_tags_later(resp)
        except BaseException:
            await self.abort()
            raise

    async def _ensure_upload(self) -> None:
        if self._create is None:
            kwargs: dict[str, Any] = {"ChecksumAlgorithm": "CRC32"} if self._checksum else {}
            kwargs.update(self._metadata)
            self._create_sent = time.time()
            self._create = asyncio.ensure_future(self._created(kwargs))
            self._create.add_done_callback(self._create_ended)
            _loop.abort_at_exit(self)  # still open at interpreter exit: abort the upload
        if self._upload_id is None:
            # Shielded so a cancellation here still lets abort() learn the id.
            upload_id = (await asyncio.shield(self._create)).get("UploadId")
            if not upload_id:  # botocore leaves out what the XML lacks: was KeyError 'UploadId'
                raise self._malformed("CreateMultipartUpload without an UploadId")
            self._upload_id = str(upload_id)

    async def _created(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``CreateMultipartUpload``, sent again on a temporary error (a 5xx, a throttle,
        a dropped connection) under the retry policy, as every other request of the
        write is (boto3, s3fs and the aws CLI resend it too). A try S3 may have applied
        though its answer was lost left an upload this write never learnt the id of:
        once a later try is answered, those are looked for and aborted
        (:func:`.lost_upload.abort_lost_upload`, never the one answered); where every
        try failed, the abort of the write looks for them."""
        async def once() -> dict[str, Any]:
            sent = time.time()
            try:
                return await self._call("create_multipart_upload", Bucket=self._bucket,
                                        Key=self._key, **kwargs)
            except TensorstreamError as exc:
                if may_have_made_one(exc):  # applied, its answer lost? (S3 keeps it open)
                    self._create_answered = time.time()
                    self._create_lost.append((sent, self._create_answered))
                raise

        try:
            return await once()
        except TensorstreamError as exc:  # (nearly every create goes at once: no loop built)
            if (not exc.temporary or self._state != "open" or self._retry is None
                    or self._retry.attempts <= 1):
                raise
            first = exc
        made = await sent_again(self._retry, first, once,
                                still_open=lambda: self._state == "open",
                                what=f"CreateMultipartUpload of {self._bucket}/{self._key}")
        if self._create_lost:
            await abort_lost_upload(self._call, self._bucket, self._key, self._create_lost,
                                    keep=str(made.get("UploadId") or "") or None)
            self._create_lost = []
        return made

    def _create_ended(self, _task: asyncio.Future[Any]) -> None:
        self._create_answered = time.time()  # (a lost upload was made before this)

    async def _upload(self, number: int, body: Callable[[], Any], **kwargs: Any) -> dict[str, Any]:
        """One UploadPart, sent again on a temporary error (a 5xx, a throttle, a dropped
        connection) up to the retry policy's attempts: a part is idempotent (the last
        upload of a part number is the one completed), and ``body()`` gives its bytes
        from the start each time."""
        if self._checksum:
            kwargs["ChecksumAlgorithm"] = "CRC32"

        async def once() -> dict[str, Any]:
            return await self._call("upload_part", Bucket=self._bucket, Key=self._key,
                                    UploadId=self._upload_id, PartNumber=number, Body=body(),
                                    **kwargs)

        if self._retry is None or self._retry.attempts <= 1:
            return await once()
        try:
            return await once()
        except TensorstreamError as exc:  # (nearly every part goes at once: no loop built)
            if not exc.temporary or self._state != "open":
                raise  # (an aborted upload: a part sent now could land after the abort)
            return await sent_again(self._retry, exc, once,
                                    still_open=lambda: self._state == "open",
                                    what=f"part {number} of {self._bucket}/{self._key}")

    async def _put_part(self, number: int, data: bytes | memoryview, md5: bytes) -> None:
        resp = await self._upload(
            number, lambda: data if isinstance(data, bytes) else _ViewFile(memoryview(data)),
            ContentMD5=base64.b64encode(md5).decode())
        self._check_etag(resp, md5.hex(), None, f"part {number}")
        self._parts[number] = self._part_entry(number, resp)
        self._part_sizes[number] = len(data)
        self._md5s[number] = md5

    # -- internals --------------------------------------------------------------
    async def _set_tags_later(self, published: dict[str, Any]) -> None:
        """Tags too long for the upload's header, set on the object now published
        (:func:`.tags.put_later`; ``published``: the publish's answer, whose
        ``VersionId`` is the version it is, in a versioned bucket); refused, exactly
        that object is removed again (:func:`.cleanup.delete_written`: deleted by key, a
        delete marker would hide what the key held before)."""
        version_id, etag = published.get("VersionId"), published.get("ETag")
        async def send(op: str, **kwargs: Any) -> Any:
            try:
                return await self._call(op, **kwargs)
            except TensorstreamError as exc:
                if not exc.temporary or self._retry is None or self._retry.attempts <= 1:
                    raise
                return await sent_again(self._retry, exc, lambda: self._call(op, **kwargs),
                                        still_open=lambda: True,
                                        what=f"PutObjectTagging of {self._bucket}/{self._key}")

        async def remove() -> str:
            try:
                if not await delete_written(self._call, self._bucket, self._key, version_id,
                                            etag):
                    return "another writer's object replaced it since (left as it is)"
            except TensorstreamError as exc:
                return f"it could not be removed ({exc.message}): it is there without its tags"
            return "the object was removed again"

        await put_later(send, self._bucket, self._key, self._tags_later, remove,
                        version_id=version_id)

    def _malformed(self, what: str) -> ProtocolError:
        return ProtocolError(f"S3 answered {what}", service="s3",
                             path=f"{self._bucket}/{self._key}")

    def _part_entry(self, number: int, resp: dict[str, Any]) -> dict[str, Any]:
        """The part as complete_multipart_upload lists it (with its CRC32 when sent)."""
        if not resp.get("ETag"):  # CompleteMultipartUpload must name it: was KeyError 'ETag'
            raise self._malformed(f"UploadPart {number} without an ETag")
        if resp.get("ServerSideEncryption") in KMS_ENCRYPTION or resp.get("SSECustomerAlgorithm"):
            self._etags_are_md5 = False  # (the complete's answer names no SSE-C)
        part: dict[str, Any] = {"PartNumber": number, "ETag": resp["ETag"]}
        if self._checksum and resp.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = resp["ChecksumCRC32"]
        return part

    async def _start_part(self, body: bytearray) -> None:
        if self._error is not None:
            raise self._error
        if self._part_number >= self.max_parts:
            # S3 would refuse part 10,001 -- after the hours the first 10,000 took.
            raise UnsupportedOperationError(
                f"{self._sent + len(body)} bytes written are more than S3's "
                f"{self.max_parts} parts hold (S3 stores at most 5 TiB in one object); "
                "split it into several objects (shards)",
                service="s3", path=f"{self._bucket}/{self._key}")
        if self._sent + len(body) > self.max_object_size:
            # 10,000 grown parts hold 9 TiB: CompleteMultipartUpload would refuse
            # (EntityTooLarge) after every part was sent.
            raise UnsupportedOperationError(
                f"{self._sent + len(body)} bytes written are more than S3 stores in one "
                f"object ({self.max_object_size} bytes, 5 TiB); split it into several "
                "objects (shards)", service="s3", path=f"{self._bucket}/{self._key}")
        self._sent += len(body)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_in_flight)
        await self._ensure_upload()
        weight = self._weight(len(body))
        for _ in range(weight):  # (the only task that acquires: no deadlock)
            await self._slots.acquire()
        self._part_number += 1
        self._tasks.append(asyncio.ensure_future(
            self._upload_part(self._part_number, body, weight)))

    async def _upload_part(self, number: int, body: bytearray, weight: int) -> None:
        assert self._slots is not None
        try:
            resp = await self._upload(number, lambda: body)
            self._parts[number] = self._part_entry(number, resp)
            self._part_sizes[number] = len(body)
        except Exception as exc:
            if self._error is None:
                self._error = exc
        finally:
            for _ in range(weight):
                self._slots.release()

    async def _abort_remote(self) -> None:
        if await self._unpublish():
            return  # the upload is complete: nothing is left of it to abort
        # No part starts now (the writer is aborted); those sent are waited for (up to
        # part_tasks.SETTLE s), not cancelled: S3 stores a part whose request it has
        # whether its client hung up or not, and one stored after the abort is left.
        await drain([*self._tasks, *self._in_flight])
        upload_id = self._upload_id
        if upload_id is None and self._create is not None:
            try:
                upload_id = str((await self._create)["UploadId"])
            except TensorstreamError:
                if self._create_lost:  # tries applied, their answers lost? (S3 keeps them)
                    await abort_lost_upload(self._call, self._bucket, self._key,
                                            self._create_lost)
                upload_id = None
            except BaseException:
                upload_id = None
        if upload_id is None:
            return
        from ...layers.retrying import retrying  # (here: only an aborted upload needs it)

        try:
            # Idempotent, and what keeps storage from filling with orphaned parts:
            # retried on temporary errors (a connection the cancelled parts broke),
            # by the policy layer's loop with a short budget of its own.
            async for attempt in retrying(
                    _ABORT_RETRY, None,
                    retry_if=lambda e: isinstance(e, TensorstreamError) and e.temporary,
                    before_sleep=lambda state: None):
                with attempt:
                    await self._call("abort_multipart_upload", Bucket=self._bucket,
                                     Key=self._key, UploadId=upload_id)
            await abort_again(self._call, self._bucket, self._key, upload_id)
        except NotFoundError:
            # No such upload: completed after all (a CompleteMultipartUpload whose
            # answer was lost, applied after the object was looked at) or aborted
            # by someone else. Was a warning that a lifecycle rule would remove it.
            await self._unpublish_completed()
        except TensorstreamError as exc:
            not_aborted(self._bucket, self._key, upload_id, exc)
