"""A copy S3 makes itself in parts (``UploadPartCopy``), for :mod:`.server_copy`.

The parts follow the source's own layout where S3 tells it (``HEAD ?partNumber=N``),
so the copy's ETag (the MD5 of the parts' MD5s, ``-N``) is the source's and is
compared before anything is published; else ``part_size`` parts, and only the size
is compared. A failed copy is aborted (again while S3 still lists it), an upload
made while the copy was stopped too, and a complete whose answer was lost is looked
at rather than reported as failed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ...errors import (
    IntegrityError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    TensorstreamError,
)
from ...uri import redact_text
from ..base import ObjectInfo
from .aborts import abort_again, not_aborted
from .applied import completed_anyway, written_since
from .etags import KMS_ENCRYPTION, etag_md5
from .lost_upload import abort_lost_upload, may_have_made_one
from .part_tasks import SETTLE, run_all, settled
from .parts import MAX_PARTS, known_size_part
from .server_copy_calls import (
    Calls,
    Copied,
    ServerCopyUnsupported,
    head_source,
    refused_writing,
    remove,
    split,
)

__all__ = ["copy_parts"]

log = logging.getLogger("tensorstream.s3")

#: Source part lookups (``HEAD ?partNumber``) in flight at once.
_LOOKUPS = 16


async def copy_parts(call: Calls, src_path: str, dst_path: str, etag: str,
                      md5: tuple[str, int | None] | None, size: int,
                      carried: dict[str, Any], *,
                      part_size: int, concurrency: int,
                      advance: Callable[[int], None] | None,
                      kms_source: bool = False) -> Copied:
    """A multipart upload of ``UploadPartCopy`` parts: the source's own layout where S3
    tells it (the copy's ETag is then the source's), else ``part_size`` parts; the upload
    is made with ``carried`` (the source's metadata, the caller's over it). ``kms_source``:
    the source is encrypted with SSE-KMS (a refused part may be its key's)."""
    layout = None
    if md5 is not None and md5[1] is not None:
        layout = await _source_layout(call, src_path, etag, md5[1], size)
    own = layout is None
    if layout is None:
        step = known_size_part(size, part_size, MAX_PARTS)
        layout = [(at, min(at + step, size)) for at in range(0, size, step)] or [(0, 0)]
    bucket, key = split(dst_path)
    carried = {k: v for k, v in carried.items() if v}
    sent = time.time()
    # Sent again on a temporary error under the retry policy, as every other request of
    # the copy is; each try whose answer was lost may have made an upload (lost below).
    tries: list[tuple[float, float, TensorstreamError]] = []
    # Shielded: a cancellation (Ctrl-C) while S3 makes the upload still learns its id, to
    # abort it (S3 goes on with a request it has).
    create = asyncio.ensure_future(call("create_multipart_upload", dst_path, failed=tries,
                                        Bucket=bucket, Key=key, **carried))
    try:
        upload = await asyncio.shield(create)
    except asyncio.CancelledError:
        await asyncio.shield(_abort_created(call, dst_path, create))
        raise
    except PermissionDeniedError as exc:
        await asyncio.shield(_abort_lost(call, dst_path, tries, None))
        raise refused_writing(exc) from exc
    except TensorstreamError:
        await asyncio.shield(_abort_lost(call, dst_path, tries, None))
        raise
    upload_id = str(upload.get("UploadId") or "")
    await asyncio.shield(_abort_lost(call, dst_path, tries, upload_id or None))
    if not upload_id:
        raise IntegrityError("S3 answered CreateMultipartUpload without an UploadId")
    source = dict(zip(("Bucket", "Key"), split(src_path), strict=True))
    etags: dict[int, str] = {}
    # The copy encrypted with KMS (the bucket's default): its parts' ETags look like MD5s
    # but are not, so they cannot make the source's (as for one CopyObject's ETag).
    encrypted = [upload.get("ServerSideEncryption") in KMS_ENCRYPTION]
    slots = asyncio.Semaphore(max(1, concurrency))

    stop = [False]  # a part failed: no other is sent

    async def part(number: int, start: int, end: int) -> None:
        async with slots:
            if stop[0]:
                return
            extra: dict[str, Any] = (
                {"CopySourceRange": f"bytes={start}-{end - 1}"} if end > start else {})
            resp = await call("upload_part_copy", dst_path, Bucket=bucket, Key=key,
                              UploadId=upload_id, PartNumber=number, CopySource=source,
                              CopySourceIfMatch=etag, **extra)
        got = (resp.get("CopyPartResult") or {}).get("ETag")
        if not got:
            raise IntegrityError(f"S3 answered UploadPartCopy {number} without an ETag")
        etags[number] = str(got)
        if resp.get("ServerSideEncryption") in KMS_ENCRYPTION:
            encrypted[0] = True
        if advance is not None:
            advance(end - start)

    try:
        try:
            await settled([asyncio.ensure_future(part(n, s, e))
                             for n, (s, e) in enumerate(layout, 1)], stop)
        except PermissionDeniedError as exc:
            raise refused_writing(exc, kms_source=kms_source) from exc
        parts = [{"PartNumber": n, "ETag": etags[n]} for n in range(1, len(layout) + 1)]
        compared = (not own and md5 is not None and not encrypted[0]
                    and all(etag_md5(p["ETag"]) for p in parts))
        if compared:
            assert md5 is not None
            made = hashlib.md5(b"".join(bytes.fromhex(etag_md5(p["ETag"])[0])  # type: ignore[index]
                                        for p in parts)).hexdigest()
            if (made, len(parts)) != md5:
                raise ObjectChangedError(
                    f"the copied parts make the ETag \"{made}-{len(parts)}\", the source's is "
                    f"{etag}: the source changed while it was copied (or the server copied "
                    "other bytes); nothing was published")
        else:  # still the version the parts were pinned to
            await head_source(call, src_path, ObjectInfo(path=src_path, size=size, etag=etag))
        try:
            done = await call("complete_multipart_upload", dst_path, once=True, Bucket=bucket,
                              Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except TensorstreamError as exc:
            # Applied, its answer lost (a timeout, a cut connection)? The copy holding the
            # source's ETag says so; otherwise the error stands and the upload is aborted.
            done = await _published_anyway(call, dst_path, md5 if compared else None,
                                           upload_id, len(parts), size, sent, exc)
    except BaseException:
        await asyncio.shield(_abort(call, dst_path, upload_id))
        raise
    if compared and etag_md5(done.get("ETag")) not in (None, md5):
        then = await remove(call, dst_path, done.get("VersionId"), done.get("ETag"))
        raise IntegrityError(f"the copy's ETag {done.get('ETag')} is not the source's {etag}; "
                             f"{then}")
    return Copied("ETag" if compared else None, len(parts), done.get("VersionId"),
                  done.get("ETag"))


async def _abort_lost(call: Calls, dst_path: str,
                      tries: list[tuple[float, float, TensorstreamError]],
                      keep: str | None) -> None:
    """Abort the uploads the failed ``tries`` (each sent, failed, why) of the copy's
    ``CreateMultipartUpload`` may have made, their answers lost (S3 keeps them open); never
    ``keep``, the upload a later try was answered with."""
    lost = [(sent, failed) for sent, failed, exc in tries if may_have_made_one(exc)]
    if lost:
        bucket, key = split(dst_path)
        await abort_lost_upload(lambda op, **kw: call(op, dst_path, **kw), bucket, key, lost,
                                keep=keep)


async def _published_anyway(call: Calls, dst_path: str,
                            md5: tuple[str, int | None] | None, upload_id: str,
                            parts: int, size: int, since: float,
                            error: TensorstreamError) -> dict[str, Any]:
    """The destination's HEAD if the failed complete (``error``) was applied, else
    ``error`` is raised. Applied: the object holds the ETag ``md5`` (the copy's),
    written since ``since``; where
    no ETag can say (``md5`` None), the upload is gone (``NoSuchUpload``) and the object
    holds ``size`` bytes in ``parts`` parts, written since ``since``
    (:func:`.applied.completed_anyway`, as the writer's)."""
    bucket, key = split(dst_path)
    if md5 is None:
        head = await completed_anyway(lambda op, **kw: call(op, dst_path, **kw), bucket, key,
                                      upload_id, parts, size, since, error)
    else:
        asked = time.time()
        try:
            head = await call("head_object", dst_path, Bucket=bucket, Key=key)
        except TensorstreamError:
            head = {}
        # (and written since: an earlier copy of the same source has the same ETag, and
        # taking it left this copy's metadata unapplied and its upload open)
        if etag_md5(str(head.get("ETag") or "").strip('"')) != md5 or not written_since(
                head, since, asked):
            raise error
    log.info("CompleteMultipartUpload of %s failed, but the object holds the copy "
             "(ETag %s): it was applied", redact_text(dst_path), head.get("ETag"))
    return head


async def _source_layout(call: Calls, src_path: str, etag: str, count: int,
                         size: int) -> list[tuple[int, int]] | None:
    """The byte range of each of the source's ``count`` parts (``HEAD ?partNumber=N``,
    pinned to ``etag``); None where the server does not say (the copy then uses its
    own layout and cannot compare ETags)."""
    if not 1 <= count <= MAX_PARTS:
        return None
    bucket, key = split(src_path)
    slots = asyncio.Semaphore(_LOOKUPS)

    async def one(number: int) -> tuple[int, int] | None:
        async with slots:
            resp = await call("head_object", src_path, Bucket=bucket, Key=key,
                              PartNumber=number, IfMatch=etag)
        return _range(str(resp.get("ContentRange") or ""), size)

    try:
        ranges = await run_all(one(n) for n in range(1, count + 1))
    except (ObjectChangedError, PermissionDeniedError, NotFoundError, ServerCopyUnsupported):
        raise
    except TensorstreamError:
        return None  # (a server that takes no partNumber)
    if any(r is None for r in ranges):
        return None
    found = [r for r in ranges if r is not None]
    ends = [0] + [end for _start, end in found]
    if [start for start, _end in found] != ends[:-1] or ends[-1] != size:
        return None  # not a layout of this object's bytes
    return found


def _range(text: str, size: int) -> tuple[int, int] | None:
    """``(start, end)`` of ``bytes A-B/SIZE`` (None if it is not that, for ``size``, or
    names no byte: ``B`` below ``A``, which an answer that lies may chain on to the next
    part's start; such a part sent no ``CopySourceRange``, and S3 copied the whole source
    as that part)."""
    unit, _, rest = text.partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or total != str(size) or not (first.isdigit() and last.isdigit()):
        return None
    if int(last) < int(first):
        return None
    return int(first), int(last) + 1


async def _abort_created(call: Calls, dst_path: str,
                         create: asyncio.Future[dict[str, Any]]) -> None:
    """Abort the upload ``create`` makes, once it is answered (up to :data:`SETTLE` s)."""
    try:
        made = await asyncio.wait_for(asyncio.shield(create), SETTLE)
    except BaseException:  # (failed, or not answered in time: a lifecycle rule's then)
        if create.done() and not create.cancelled():
            create.exception()
        return
    if made.get("UploadId"):
        await _abort(call, dst_path, str(made["UploadId"]))


async def _abort(call: Calls, dst_path: str, upload_id: str) -> None:
    """Abort the upload, and again while it is still listed (:func:`.aborts.abort_again`);
    one not aborted is named in a warning, as the writer's is."""
    bucket, key = split(dst_path)
    try:
        await call("abort_multipart_upload", dst_path, Bucket=bucket, Key=key,
                   UploadId=upload_id)
    except NotFoundError:
        return  # gone: completed, or aborted by another
    except TensorstreamError as exc:
        not_aborted(bucket, key, upload_id, exc)
        return
    await abort_again(lambda op, **kw: call(op, dst_path, **kw), bucket, key, upload_id)
