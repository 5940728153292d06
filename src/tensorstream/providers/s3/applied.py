"""Whether a ``CompleteMultipartUpload`` that failed was applied all the same, where
no ETag can say so (SSE-KMS, SSE-C: ETags are no MD5s).

S3 applies a request it received even when its answer is lost (a timeout, a cut
connection, a 5xx from a proxy in front); a resend then answers ``NoSuchUpload``. The
upload being gone, and the object holding as many parts (``-N``) and bytes as it,
written since the write began, it was applied: reporting a failure told the caller
nothing was published while the previous version had been replaced. Where the parts
were sent with CRC32 checksums (the writer's default), the object's checksum must be
the one they make (S3's composite: the CRC32 of the parts' CRC32s, ``-N``): another
writer's bytes of the same size in as many parts, stored after an abort by another, have
another (or none), and were taken for this write's. Used by the
writer (:mod:`.publish`) and by S3's own copy in parts (:mod:`.server_copy_parts`).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import NotFoundError, TensorstreamError
from .lost_upload import clock_skew

__all__ = ["completed_anyway", "holds_checksum", "part_checksums", "written_since"]

#: Seconds of slack when an object's ``Last-Modified`` is compared with the time a
#: write began, on S3's clock: one for ``Last-Modified`` being whole seconds (truncated),
#: one for S3's hosts' clocks differing a little. Where S3's clock is read from (the
#: look's ``Date``) is bounded by the look's send time, so a slow look does not widen it:
#: an object written more than this before the write began is never taken for it.
_SLACK = 2.0


async def completed_anyway(call: Callable[..., Awaitable[dict[str, Any]]], bucket: str,
                           key: str, upload_id: str, parts: int, size: int,
                           since: float | None, error: TensorstreamError,
                           checksums: list[str] | None = None) -> dict[str, Any]:
    """The object's ``HEAD`` if the upload ``upload_id`` of ``parts`` parts and ``size``
    bytes, whose complete failed with ``error``, was completed: the upload is gone
    (``NoSuchUpload``) and the object holds ``parts`` parts of ``size`` bytes, written at
    ``since`` (``time.time()``; None: not compared) or later. Else ``error`` is raised;
    where the upload is gone but the object is not this one (another's abort, a
    lifecycle rule; or it was completed and replaced since), a
    :class:`~tensorstream.errors.NotFoundError` saying so. ``checksums``: the parts'
    CRC32s (base64, in order) where each was sent with one; the object must then hold
    the checksum they make. ``call(op, **kwargs)`` sends one request."""
    gone = isinstance(error, NotFoundError)  # (NoSuchUpload: a resend's answer)
    if not gone:
        try:
            await call("list_parts", Bucket=bucket, Key=key, UploadId=upload_id, MaxParts=1)
        except NotFoundError:
            gone = True  # completed (or aborted by another)
        except TensorstreamError:
            pass
    if not gone:  # still open (not applied), or it cannot be told
        raise error
    asked = time.time()
    try:
        head = await call("head_object", Bucket=bucket, Key=key,
                          **({"ChecksumMode": "ENABLED"} if checksums else {}))
    except TensorstreamError:
        head = {}
    tag = str(head.get("ETag") or "").strip('"')
    if (tag.endswith(f"-{parts}") and int(head.get("ContentLength", -1)) == size
            and (since is None or written_since(head, since, asked))
            and (not checksums or holds_checksum(head, checksums))):
        return head
    found = (f"holds {head.get('ContentLength')} bytes, ETag {head.get('ETag')}, "
             + (f"CRC32 {head.get('ChecksumCRC32')}, " if checksums else "")
             + f"last modified {head.get('LastModified')}" if head else "could not be looked at")
    said = (error.message if isinstance(error, NotFoundError) else
            f"CompleteMultipartUpload failed ({error}), and the multipart upload is gone "
            "(NoSuchUpload)")
    raise NotFoundError(
        f"{said}; the object {found}, not this write's {size} bytes in {parts} parts: the "
        "upload was aborted by another (a lifecycle rule, another writer), or completed and "
        "the object replaced since; run the write again",
        service="s3", path=f"{bucket}/{key}") from error


def part_checksums(parts: list[dict[str, Any]]) -> list[str] | None:
    """The CRC32 of each part (``ChecksumCRC32`` as ``CompleteMultipartUpload`` lists
    them), in order; None unless every part has one."""
    crcs = [str(part["ChecksumCRC32"]) for part in parts if part.get("ChecksumCRC32")]
    return crcs if parts and len(crcs) == len(parts) else None


def holds_checksum(head: dict[str, Any], checksums: list[str]) -> bool:
    """Whether ``head`` (asked with ``ChecksumMode``) holds the composite CRC32 of parts
    whose CRC32s are ``checksums``: the CRC32 of their digests end to end, ``-N`` (S3
    names the count; moto does not). None held (another writer's upload without
    checksums), or a whole-object one (an upload created with a ``ChecksumType`` this
    write did not ask for), is not this write."""
    held = str(head.get("ChecksumCRC32") or "")
    if not held or str(head.get("ChecksumType") or "COMPOSITE") != "COMPOSITE":
        return False
    try:
        digests = b"".join(base64.b64decode(c, validate=True) for c in checksums)
    except (binascii.Error, ValueError):
        return False
    made = base64.b64encode(zlib.crc32(digests).to_bytes(4, "big")).decode()
    value, _, count = held.partition("-")
    return value == made and count in ("", str(len(checksums)))


def written_since(head: dict[str, Any], since: float, asked: float) -> bool:
    """Whether the object ``head`` describes was written at ``since`` (``time.time()``)
    or later, on S3's clock (its answer's ``Date``; ``asked``: when the ``HEAD`` was
    sent). The same bytes stored before this write began (an earlier upload of the same
    file) have its ETag too, but are not its success: taking them for it left this
    write's metadata, storage class and encryption unapplied, and its multipart upload
    open. No date: not known to be.

    S3 stamped the ``Date`` after ``asked``, so its clock is read as the latest it can
    be (:func:`.lost_upload.clock_skew`'s high bound): the skew read from when the answer
    came (as before) was lower by as long as the look took, and a ``HEAD`` slowed by a
    few seconds took an object written those seconds before the write for its own. The
    cost is on the other side: an object written within a slow look's round trip after
    ``since`` may not be known for this write's (it is then sent again, or reported)."""
    modified = head.get("LastModified")
    if not isinstance(modified, datetime.datetime) or modified.tzinfo is None:
        return False
    _, high = clock_skew(head, asked, time.time())
    return modified.timestamp() >= since + high - _SLACK
