"""A multipart upload whose ``CreateMultipartUpload`` answer was lost.

S3 may apply a ``CreateMultipartUpload`` and the answer never arrive (a cut connection, a
timeout, a 500 after the fact): the upload is open, and the writer that asked never
learnt its id, so nothing aborted it; it stayed, its parts billed, until a bucket
lifecycle rule removed it. :func:`abort_lost_upload` looks for it and aborts it.

An upload carries nothing of its own that a listing shows and the object would not keep
(metadata, tags and the storage class all end up on the object), so it is told from
another writer's by what a listing does show: the key, the time S3 initiated it (within
the seconds the request was in flight, until its failure, on S3's clock, read from the listing's ``Date``),
and no part (the writer never had an id to send one with). As many such uploads as tries
whose answers were lost are aborted (one, unless the create was sent again), never the
one a later try was answered with; more (another writer of the same key in the same
seconds) are all left alone, said in the log. A key pair that may not list uploads
(``s3:ListBucketMultipartUploads``) leaves it to a lifecycle rule, as before.
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import ServiceUnavailableError, TensorstreamError

__all__ = ["abort_lost_upload", "clock_skew", "may_have_made_one"]

log = logging.getLogger("tensorstream.s3")

#: Seconds added at both ends of the time the request was in flight: S3's ``Date`` is
#: in whole seconds, and it stamps an upload when it handles the request.
_SLACK = 2.0
#: Pages of uploads of the key looked through (S3: 1000 a page).
_PAGES = 10


def may_have_made_one(exc: TensorstreamError) -> bool:
    """Whether a ``CreateMultipartUpload`` that failed with ``exc`` may have made an upload:
    a temporary error (a 5xx, a lost answer) leaves it open, but not S3 turning it away as
    a throttle (``SlowDown``): nothing was made then, and a look would take another
    writer's upload of those seconds, its first part still on its way, for this one."""
    if isinstance(exc, ServiceUnavailableError) and exc.not_applied:
        return False
    return exc.temporary


async def abort_lost_upload(call: Callable[..., Awaitable[Any]], bucket: str, key: str,
                            tries: list[tuple[float, float]], *,
                            keep: str | None = None) -> list[str]:
    """Abort the uploads of ``key`` that the ``tries`` of a ``CreateMultipartUpload`` (each
    ``(sent, failed)``, ``time.time()``, one a try whose answer was lost) made if S3
    applied them; ``keep``: the upload a later try made and answered (sent again under
    the retry policy), never aborted. ``call(op, **kwargs)`` sends one request. The ids
    of the uploads aborted.

    An upload is looked for within each try's own seconds, not from the first try's to
    the last's: the retry policy's waits between them (seconds) are no try's, and an
    upload another writer of the key started then was taken for a lost one (as many
    are aborted as tries were lost)."""
    if not tries:
        return []
    try:
        listing, uploads, asked = await _uploads_of(call, bucket, key)
    except TensorstreamError as exc:
        log.info("%s/%s: could not list its multipart uploads to find one whose "
                 "CreateMultipartUpload answer was lost: %s", bucket, key, exc)
        return []
    if listing is None:
        log.info("%s/%s: more than %d pages of multipart uploads of that key: the one whose "
                 "CreateMultipartUpload answer was lost is left", bucket, key, _PAGES)
        return []
    # S3's clock read from when the listing came (the low bound: a listing slowed on
    # its way to S3 has a late Date, and the high bound moved the window past the lost
    # upload). Not up to now: an upload another writer started after the failure, while
    # the uploads were listed, say, is not the lost one.
    skew, _ = clock_skew(listing, asked, time.time())
    windows = [(sent + skew - _SLACK, failed + skew + _SLACK) for sent, failed in tries]
    made = [str(u.get("UploadId") or "") for u in uploads
            if u.get("Key") == key and (at := _seconds(u.get("Initiated"))) is not None
            and any(start <= at <= end for start, end in windows)
            and u.get("UploadId") != keep]
    attempts = len(tries)
    aborted: list[str] = []
    try:
        # This writer never had the id to send a part with: one with a part is another's.
        mine = [upload_id for upload_id in made if not (await call(
            "list_parts", Bucket=bucket, Key=key, UploadId=upload_id, MaxParts=1)).get("Parts")]
        if len(mine) > attempts:
            log.warning("%s/%s: %d multipart uploads without parts were started while "
                        "this one's CreateMultipartUpload answer was lost (%d tries); none is "
                        "aborted (one is another writer's)", bucket, key, len(mine), attempts)
            return []
        for upload_id in mine:
            await call("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            aborted.append(upload_id)
            log.info("%s/%s: aborted the upload %s, whose CreateMultipartUpload answer was "
                     "lost", bucket, key, upload_id)
    except TensorstreamError as exc:
        log.info("%s/%s: could not abort the upload whose CreateMultipartUpload answer was "
                 "lost: %s", bucket, key, exc)
    return aborted


async def _uploads_of(call: Callable[..., Awaitable[Any]], bucket: str, key: str
                      ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], float]:
    """The last ``ListMultipartUploads`` answer and every upload of ``key`` (pages
    followed: S3 gives 1000 a page, a key's uploads first, oldest first, so the lost
    one, the newest, came on a later page of a key with many), and when that answer was
    asked for (``time.time()``); no answer (None) past :data:`_PAGES` pages, where
    another upload of the same seconds may be unseen."""
    args: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
    uploads: list[dict[str, Any]] = []
    asked = time.time()
    for _ in range(_PAGES):
        asked = time.time()
        listing = dict(await call("list_multipart_uploads", **args))
        uploads += [u for u in listing.get("Uploads") or [] if u.get("Key") == key]
        marker = (listing.get("NextKeyMarker"), listing.get("NextUploadIdMarker"))
        if not listing.get("IsTruncated") or marker[0] != key or not marker[1]:
            return listing, uploads, asked  # (past the key's uploads, or no way on)
        args.update(KeyMarker=marker[0], UploadIdMarker=marker[1])
    return None, uploads, asked


def clock_skew(answer: dict[str, Any], sent: float, received: float) -> tuple[float, float]:
    """S3's clock minus ours, as the bounds ``(low, high)`` an answer's ``Date`` gives:
    S3 stamped it between the request's ``sent`` and the answer's ``received``
    (``time.time()``), in whole seconds (truncated), so the skew is at least
    ``Date - received`` and below ``Date + 1 - sent``. A slow answer leaves the bounds as
    far apart as it took: :func:`.applied.written_since` takes the high one (a slow look
    never takes an older object for a write); the lost upload's window the low one, as
    before (:func:`abort_lost_upload`). ``(0, 0)`` where it has no ``Date``."""
    headers = (answer.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    try:
        said = email.utils.parsedate_to_datetime(str(headers.get("date")))
    except (TypeError, ValueError, OverflowError):  # (a year of 20 digits overflows)
        return 0.0, 0.0
    if said.tzinfo is None:
        return 0.0, 0.0
    return said.timestamp() - received, said.timestamp() + 1.0 - sent


def _seconds(value: object) -> float | None:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.timestamp()
    return None
