"""An S3 write's publish: the request that makes the object appear, what its answer is
compared with, and its undoing by an abort.

The request that publishes (``PutObject``, ``CompleteMultipartUpload``) is not
cancelled once sent -- S3 finishes a request it received even when the client hangs
up -- but runs to its answer as a task, which an abort waits for: if it published,
the abort removes the object again. An answer lost (a timeout, a dropped connection)
after S3 applied the request is looked at: the object holding the ETag this write
makes, and written since this write began (an older object of the same bytes is
another upload's), is the success it was. A ``PutObject`` that failed with a temporary error is
sent again under the retry policy (:mod:`.resend`), each time after that look: an
attempt applied is not sent again. The ETag S3 answers is compared with the MD5s
taken of the source's bytes where it is one (:mod:`.etags`).

:class:`Publishing` is the base of :class:`~.writer.S3Writer`, which uploads the parts
and sets the attributes declared here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from ...config import RetryConfig
from ...errors import IntegrityError, TensorstreamError
from ...layers.resend import sent_again
from ..base import Writer
from .applied import completed_anyway, holds_checksum, part_checksums, written_since
from .cleanup import delete_written
from .etags import KMS_ENCRYPTION, etag_md5

__all__ = ["Publishing"]

log = logging.getLogger("tensorstream.s3")

class Publishing(Writer):
    """The publish of :class:`~.writer.S3Writer`: sent, checked, looked at when its
    answer was lost, and undone by an abort."""

    _call: Callable[..., Awaitable[dict[str, Any]]]
    _bucket: str
    _key: str
    #: Content-Type, user metadata, ... sent with the upload (:mod:`.metadata`).
    _metadata: dict[str, Any]
    _state: str
    _upload_id: str | None
    #: The parts uploaded, as CompleteMultipartUpload lists them, by part number.
    _parts: dict[int, dict[str, Any]]
    #: What S3 answered names no encryption under which its ETags are not MD5s.
    _etags_are_md5: bool
    #: Whether every request is sent with a CRC32 checksum (S3 keeps it).
    _checksum: bool
    #: The request that publishes, once sent (see _publish).
    _publish_job: asyncio.Future[dict[str, Any]] | None
    #: The retry policy a PutObject (and an UploadPart) is sent again under (None: once).
    _retry: RetryConfig | None
    #: When the CreateMultipartUpload was sent (``time.time()``; 0: not yet).
    _create_sent: float
    #: The size of each part uploaded, by part number.
    _part_sizes: dict[int, int]

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(f"write to an S3 writer that is {self._state}")

    async def _put(self, body: bytes, md5: bytes | None = None) -> dict[str, Any]:
        """The ``PutObject`` of a small object (with its ``Content-MD5`` where the
        caller has it), sent again on a temporary error under the retry policy, as
        an ``UploadPart`` is (:mod:`.resend`; boto3, s3fs and the aws CLI do so too).
        S3 may have applied an attempt whose answer was lost (a connection cut after
        the body went, a 5xx from a proxy in front): before each resend, and after
        the last failure, the object is looked at (``HEAD``), and if its ETag is the
        MD5 of ``body`` it holds exactly these bytes, the success it was; it is not
        written again (over what another writer stored since, say)."""
        kwargs: dict[str, Any] = (
            {"ContentMD5": base64.b64encode(md5).decode()} if md5 is not None else {})
        kwargs.update(self._metadata)
        want = (md5 if md5 is not None else hashlib.md5(body).digest()).hex()
        since = time.time()
        # (what says so under SSE-KMS/SSE-C, whose ETag is no MD5: the CRC32 S3 keeps)
        crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode() \
            if self._checksum else None

        async def once() -> dict[str, Any]:
            return await self._publish("put_object", Bucket=self._bucket, Key=self._key,
                                       Body=body, **kwargs)

        async def again() -> dict[str, Any]:
            held = await self._holding(want, None, since, crc)
            if held is not None:
                log.info("PutObject of %s/%s failed, but the object holds this write (ETag "
                         "%s): it was applied", self._bucket, self._key, held["ETag"])
                return held
            return await once()

        try:
            return await once()
        except TensorstreamError as exc:
            error = exc
        if (error.temporary and self._state == "open" and self._retry is not None
                and self._retry.attempts > 1):
            try:
                return await sent_again(self._retry, error, again,
                                        still_open=lambda: self._state == "open",
                                        what=f"PutObject of {self._bucket}/{self._key}")
            except TensorstreamError as exc:
                error = exc
        return await self._published_anyway(error, "PutObject", want, None, since, crc)

    async def _complete(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """``CompleteMultipartUpload``, sent again on a temporary error as the
        ``PutObject`` is (:meth:`_put`). S3 applies a request it received even when
        its answer is lost (a timeout, a dropped connection, a 5xx from a proxy in
        front): before a resend and after the last failure the object is looked at,
        and if its ETag is the one these parts make (the MD5 of their MD5s, ``-N``),
        the upload was completed and the write succeeded; reporting a failure then
        told the caller nothing was published while the previous version had been
        replaced. Otherwise the error stands and the upload is aborted. Where a
        part's ETag is no MD5 (SSE-KMS, SSE-C) the ETag cannot tell: it is sent again
        without a look, and after the last failure (a complete applied already may
        answer ``NoSuchUpload``) the upload gone and the object holding as many parts
        and bytes, written since the write began, is the success it was
        (:func:`.applied.completed_anyway`)."""
        digests = [etag_md5(part["ETag"]) for part in parts]
        since = self._create_sent  # (S3 dates such an object from its upload's start or end)
        want = None if not self._etags_are_md5 or any(
            d is None or d[1] is not None for d in digests) else (
            hashlib.md5(b"".join(bytes.fromhex(d[0]) for d in digests if d)).hexdigest())

        async def once() -> dict[str, Any]:
            return await self._publish(
                "complete_multipart_upload", Bucket=self._bucket, Key=self._key,
                UploadId=self._upload_id, MultipartUpload={"Parts": parts},
            )

        async def again() -> dict[str, Any]:
            held = None if want is None else await self._holding(want, len(parts), since)
            return held if held is not None else await once()

        try:
            return await once()
        except TensorstreamError as exc:
            error = exc
        if (error.temporary and self._state == "open" and self._retry is not None
                and self._retry.attempts > 1):
            try:
                return await sent_again(
                    self._retry, error, again, still_open=lambda: self._state == "open",
                    what=f"CompleteMultipartUpload of {self._bucket}/{self._key}")
            except TensorstreamError as exc:
                error = exc
        if want is None:
            if self._state != "open" or self._upload_id is None:
                raise error
            size = sum(self._part_sizes[part["PartNumber"]] for part in parts)
            held = await completed_anyway(self._call, self._bucket, self._key, self._upload_id,
                                          len(parts), size, since, error, part_checksums(parts))
            log.info("CompleteMultipartUpload of %s/%s failed (%s), but its upload is gone and "
                     "the object holds as many parts and bytes (ETag %s): it was applied",
                     self._bucket, self._key, type(error).__name__, held.get("ETag"))
            return held
        return await self._published_anyway(error, "CompleteMultipartUpload", want, len(parts),
                                             since)

    async def _published_anyway(self, exc: TensorstreamError, op: str, want: str,
                                count: int | None, since: float,
                                crc: str | None = None) -> dict[str, Any]:
        """``op`` failed with ``exc``: the object's ETag as its answer if it is
        the one this write makes (``want``, ``-count``, written since ``since``; or
        ``crc``, see :meth:`_holding`), else ``exc`` raised."""
        if self._state != "open":
            raise exc
        held = await self._holding(want, count, since, crc)
        if held is None:
            raise exc
        log.info("%s of %s/%s failed (%s), but the object holds this write (ETag %s): it "
                 "was applied", op, self._bucket, self._key, type(exc).__name__, held["ETag"])
        return held

    async def _holding(self, want: str, count: int | None, since: float,
                       crc: str | None = None) -> dict[str, Any] | None:
        """``{"ETag": ...}`` if the object (``HEAD``) is this write's: the ETag it
        makes (``want``, ``-count``), written since ``since`` (``time.time()``, when
        the write began); else None (also when it cannot be looked at). ``crc``: the
        CRC32 (base64) sent with a ``PutObject``'s bytes, which S3 keeps: where the
        object's ETag is no MD5 (SSE-KMS, SSE-C: it never matched, and a write S3
        applied failed), that checksum says instead."""
        mode = {"ChecksumMode": "ENABLED"} if crc is not None else {}
        asked = time.time()
        try:
            head = await self._call("head_object", Bucket=self._bucket, Key=self._key, **mode)
        except TensorstreamError:
            return None  # (the write's own error is the one to report)
        etag = head.get("ETag")
        if etag is None or not written_since(head, since, asked):
            return None
        if crc is not None and (head.get("ServerSideEncryption") in KMS_ENCRYPTION
                                or head.get("SSECustomerAlgorithm")):
            held = str(head.get("ChecksumCRC32") or "")
            shape = etag_md5(etag)
            if shape is None or shape[1] is not None or held != crc:  # (one piece: no -N)
                return None
            self._etags_are_md5 = False  # (the caller compares no ETag with the MD5)
            return {"ETag": str(etag), "ServerSideEncryption": head.get("ServerSideEncryption"),
                    "SSECustomerAlgorithm": head.get("SSECustomerAlgorithm"), **_version(head)}
        if etag_md5(etag) != (want, count):
            return None
        return {"ETag": str(etag), **_version(head)}

    async def _check_published(self, resp: dict[str, Any], want: str, count: int | None) -> None:
        """The object's ETag once published. S3 itself refuses bytes that do not
        match their Content-MD5, so a mismatch here means a service that does
        not check it: the object is removed again."""
        try:
            self._check_etag(resp, want, count, "object", then="it was removed")
        except IntegrityError:
            self._state = "committed"  # nothing left to abort: it is published
            with contextlib.suppress(Exception):  # (what it wrote only: see _unpublish)
                await delete_written(self._call, self._bucket, self._key,
                                     resp.get("VersionId"), resp.get("ETag"))
            raise

    def _check_etag(self, resp: dict[str, Any], want: str, count: int | None, what: str, *,
                    then: str = "nothing was published") -> None:
        """Compare the ETag S3 answered with the MD5 we took of the source's bytes,
        where it is one. Under SSE-KMS and SSE-C it is not, though it has the shape
        (32 hex digits): the answer says so (``x-amz-server-side-encryption:
        aws:kms``, a customer key's algorithm), and Content-MD5, which S3 checks
        itself, is then what vouches for the bytes."""
        if resp.get("ServerSideEncryption") in KMS_ENCRYPTION or resp.get("SSECustomerAlgorithm"):
            self._etags_are_md5 = False  # (a CompleteMultipartUpload's answer names no SSE-C)
        if not self._etags_are_md5:
            return
        etag = resp.get("ETag")
        got = etag_md5(etag)
        if got is not None and (got[0] != want or got[1] != count):
            raise IntegrityError(
                f"verification failed: S3 answered ETag {etag} for the {what}, the bytes "
                f"sent have MD5 {want}{f'-{count}' if count else ''}; {then}")

    async def _publish(self, op: str, **kwargs: Any) -> dict[str, Any]:
        """Send the request that makes the object appear, as a task that runs to
        its answer whoever stops waiting (S3 finishes a request it received;
        :meth:`abort` waits for it and removes what it published)."""
        self._check_open()
        job = self._publish_job = asyncio.ensure_future(self._call(op, **kwargs))
        job.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
        resp = await asyncio.shield(job)
        self._check_open()  # aborted while the answer was on its way: abort removes it
        return resp

    async def _unpublish(self) -> bool:
        """Wait for a publishing request in flight; True if it published, and then
        the object is removed again (the abort came first for the caller)."""
        job = self._publish_job
        if job is None:
            return False
        await asyncio.gather(job, return_exceptions=True)
        if job.cancelled() or job.exception() is not None:
            return False
        try:
            # The version it published (a versioned bucket; null, a suspended one's):
            # deleted by key, a delete marker would hide the previous version too; else
            # while the key holds its ETag (another writer's object since is left).
            answer = job.result()
            if not await delete_written(self._call, self._bucket, self._key,
                                        answer.get("VersionId"), answer.get("ETag")):
                log.warning("%s/%s, published while its writer was aborted, was replaced by "
                            "another writer's since: left", self._bucket, self._key)
        except TensorstreamError as exc:
            log.warning("could not remove %s/%s, published while its writer was aborted: %s",
                        self._bucket, self._key, exc)
        return True

    async def _unpublish_completed(self) -> None:
        """The upload is gone: if its complete was sent and the object holds it
        (its ETag is the one the parts make), it was published while this write
        failed, and is removed again (as a publish that raced an abort is)."""
        parts = [self._parts[n] for n in sorted(self._parts)]
        digests = [etag_md5(part["ETag"]) for part in parts]
        # Its ETag says so where the parts' are MD5s; else (SSE-KMS, SSE-C) the checksum
        # the parts' CRC32s make does (it stayed: the write failed, its bytes published).
        crcs = None if self._etags_are_md5 else part_checksums(parts)
        if self._publish_job is None or not parts or (crcs is None and any(
                d is None or d[1] is not None for d in digests)):
            return
        asked = time.time()
        try:
            if crcs is not None:
                head = await self._call("head_object", Bucket=self._bucket, Key=self._key,
                                        ChecksumMode="ENABLED")
                ours = (str(head.get("ETag") or "").strip('"').endswith(f"-{len(parts)}")
                        and holds_checksum(head, crcs))
            else:
                want = hashlib.md5(b"".join(bytes.fromhex(d[0]) for d in digests if d))
                head = await self._call("head_object", Bucket=self._bucket, Key=self._key)
                ours = etag_md5(head.get("ETag")) == (want.hexdigest(), len(parts))
            if not ours or not written_since(head, self._create_sent, asked):
                return  # (not this upload: an older object of the same bytes stays)
            # The version looked at (a versioned bucket; null, a suspended one's): deleted
            # by key, a delete marker would hide the previous version the failed write was
            # to leave in place; else only while the key holds what was looked at (If-Match:
            # another writer's object stored between the look and the delete is left).
            if not await delete_written(self._call, self._bucket, self._key,
                                        head.get("VersionId"), head.get("ETag")):
                log.warning("%s/%s: the upload of a write that failed was completed late, "
                            "and replaced by another writer's since: left", self._bucket,
                            self._key)
                return
        except TensorstreamError as exc:
            log.warning("%s/%s may hold the upload of a write that failed (its complete was "
                        "applied late): %s", self._bucket, self._key, exc)
            return
        log.warning("%s/%s: the upload of a write that failed was completed late (its answer "
                    "was lost); removed again", self._bucket, self._key)


def _version(head: dict[str, Any]) -> dict[str, str]:
    """The ``VersionId`` of the object a look found to be this write's (a versioned
    bucket's), as the lost answer would have named it: what is done to it next (its tags
    set, or it removed again when they are refused) is done to that version alone, never
    by key (a delete marker hid what the key held before)."""
    version = head.get("VersionId")
    return {"VersionId": str(version)} if version else {}
