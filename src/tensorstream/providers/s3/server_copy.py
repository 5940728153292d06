"""Copies within one S3 store made by S3 itself: no byte goes through this machine.

``aws s3 cp``, s5cmd and rclone copy ``s3://a/k`` to ``s3://b/k`` on one endpoint with
``CopyObject`` (up to 5 GiB) or a multipart upload of ``UploadPartCopy`` parts
(``x-amz-copy-source-range``); :func:`server_copy` does the same, with the checks
tensorstream's copies make:

* **One version.** The source is looked at first (``HEAD`` with ``If-Match``: the ETag
  the listing saw) and every copy request names that ETag
  (``x-amz-copy-source-if-match``): a source replaced meanwhile fails with
  ``PreconditionFailed`` (:class:`~tensorstream.errors.ObjectChangedError`).
* **Compared, where S3 makes it possible.** A source stored in one piece (its ETag the
  MD5 of its bytes) gets one ``CopyObject``, whose copy has the same MD5. A source
  uploaded in parts is copied part for part in its own layout (each part's range from
  ``HEAD ?partNumber=N``), so the copy's ETag (the MD5 of the parts' MD5s, ``-N``) is the
  source's: it is computed from the parts' ETags before anything is published, and
  compared again after. A server that ignores the condition (moto) is caught by these
  comparisons, never published as a mix. Where the ETags cannot be equal (SSE-KMS: one
  ``CopyObject`` then; a source in one piece larger than the cutoff; a layout S3 does not
  tell), only the size is compared, and the copy is said to be not verified.
* **Nothing left behind.** A multipart copy that fails is aborted; a published copy
  that fails its comparison is deleted again (as the streamed writer does).
* **Metadata** as ``aws s3 cp``: ``CopyObject`` copies it (``MetadataDirective`` COPY); a
  multipart copy sends the source's Content-Type, Cache-Control, Content-Disposition,
  Content-Encoding, Content-Language, Expires and user metadata with the upload. Fields
  the caller sets (``metadata``: ``--content-type``, ``--metadata``...) replace the
  source's: ``CopyObject`` then sends ``REPLACE`` with the source's other fields, so
  both ways store what a streamed copy does (:mod:`.metadata`).

A server that answers ``501``/``NotImplemented`` raises :class:`ServerCopyUnsupported`
(the caller falls back to a streamed copy). Access refused is said for the side it is
about: the source was read by the ``HEAD`` first, so a refused copy request is the
destination's; a source archived in Glacier and not restored (S3 refuses its copy with a
403 too) is said to be, from its ``HEAD``, before anything is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ..._log_redaction import scrub_chain
from ...errors import (
    ConfigurationError,
    IntegrityError,
    MissingCredentialsError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    TensorstreamError,
    UnsupportedOperationError,
)
from ...uri import redact_text
from ..base import ObjectInfo
from .errors import WrongRegionError
from .lost_upload import abort_lost_upload
from .metadata import carried_from_head, checked_carried
from .part_tasks import SETTLE, run_all, settled
from .parts import MAX_PARTS, known_size_part
from .writer import KMS_ENCRYPTION, _etag_md5

__all__ = ["COPY_CUTOFF", "Copied", "ServerCopyUnsupported", "same_credentials", "server_copy"]

log = logging.getLogger("tensorstream.s3")

#: The largest object one ``CopyObject`` copies (S3's limit, and rclone's cut-off).
COPY_CUTOFF = 5 << 30
#: Source part lookups (``HEAD ?partNumber``) in flight at once.
_LOOKUPS = 16
#: Storage classes whose objects S3 copies only once restored.
_ARCHIVES = frozenset({"GLACIER", "DEEP_ARCHIVE"})


#: The ways S3 copies an object, by the operations each needs: a store may have one and
#: not the other (``501 NotImplemented`` to one of them).
ONE_PIECE, IN_PARTS = "CopyObject", "UploadPartCopy"
_WAY = {"copy_object": ONE_PIECE, "create_multipart_upload": IN_PARTS,
        "upload_part_copy": IN_PARTS, "complete_multipart_upload": IN_PARTS}


class ServerCopyUnsupported(UnsupportedOperationError):
    """The server does not copy objects itself (``501 NotImplemented``), or, with
    ``this_object``, not this one (nothing was sent to the destination): the caller
    streams it, and only it. ``way``: the way of copying the server lacks
    (:data:`ONE_PIECE`, :data:`IN_PARTS`; None: every way), for the objects that need it."""

    def __init__(self, message: str, *, this_object: bool = False,
                 way: str | None = None) -> None:
        super().__init__(message)
        self.this_object = this_object
        self.way = way


@dataclasses.dataclass(frozen=True)
class Copied:
    """How a server-side copy ended: ``verified_by`` says what was compared with the
    source (None: only the size, so it is not verified); ``parts`` is 0 for one
    ``CopyObject``."""

    verified_by: str | None
    parts: int = 0


def same_credentials(a: Any, b: Any) -> bool:
    """Whether two S3 providers sign with the same credentials (a copy request reads
    the source with the destination's: another key pair per side may not read it)."""
    ca, cb = getattr(a, "credentials", None), getattr(b, "credentials", None)
    if ca is None or cb is None or ca.anonymous or cb.anonymous:
        return False

    def key(c: Any) -> tuple[Any, ...]:
        return tuple(f.value if f is not None else None for f in (
            c.access_key_id, c.secret_access_key, c.session_token, c.profile))

    return key(ca) == key(cb)


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    return bucket, key


def _not_implemented(exc: BaseException) -> bool:
    """Whether a mapped S3 error is the server saying it has no such operation."""
    cause = exc.__cause__
    response = getattr(cause, "response", None) or {}
    code = str((response.get("Error") or {}).get("Code") or "")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("NotImplemented", "XNotImplemented", "501") or status == 501


class _Calls:
    """S3 requests of a policy-wrapped S3 provider, with its retry policy (temporary
    errors sent again) and error context, ``501`` turned into
    :class:`ServerCopyUnsupported` first (not retried as a temporary 5xx).

    Not under the layer's idle watchdog: S3 answers a long copy (seconds per GiB) at
    once and sends whitespace while it copies, bytes no read reports to the watchdog,
    which cut it as idle; botocore's read timeout (``timeout_idle`` between bytes)
    applies instead."""

    def __init__(self, provider: Any, *, in_place: bool = False) -> None:
        self.s3 = provider.inner
        self.config = provider.config
        #: The copy is the source itself (new metadata, in place): never deleted.
        self.in_place = in_place

    async def _once(self, op: str, path: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return dict(await self.s3._call(op, path, **kwargs))
        except TensorstreamError as exc:
            if _not_implemented(exc):
                way = _WAY.get(op)
                raise ServerCopyUnsupported(
                    f"the server does not support {way or op} (NotImplemented)",
                    way=way) from exc
            raise

    async def __call__(self, op: str, path: str, *, once: bool = False,
                       **kwargs: Any) -> dict[str, Any]:
        """``op`` (a botocore operation) with ``kwargs``, sent again on a temporary error
        unless ``once`` (what creates an upload or publishes is sent once, as the
        writer sends it: an answer lost after S3 applied it is looked at instead)."""
        try:
            try:
                return await self._once(op, path, kwargs)
            except TensorstreamError as exc:  # (nearly every request succeeds: no loop built)
                if once or not exc.temporary or self.config.retry.attempts <= 1:
                    raise
                first: TensorstreamError | None = exc
            from ...layers.retrying import retrying

            async for attempt in retrying(
                    self.config.retry, self.config.timeouts.total,
                    retry_if=lambda e: isinstance(e, TensorstreamError) and e.temporary,
                    before_sleep=lambda state: None):
                with attempt:
                    if first is not None:
                        failed, first = first, None
                        raise failed
                    return await self._once(op, path, kwargs)
        except TensorstreamError as exc:
            exc.with_context(service="s3", operation=op, path=redact_text(path))
            scrub_chain(exc)  # (third-party causes hold request URLs and headers)
            raise
        raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover


async def server_copy(src: Any, src_path: str, info: ObjectInfo, dst: Any, dst_path: str, *,
                      cutoff: int = COPY_CUTOFF, part_size: int, concurrency: int,
                      check: bool = True, metadata: dict[str, Any] | None = None,
                      advance: Callable[[int], None] | None = None,
                      in_place: bool = False, lacks: frozenset[str] = frozenset()) -> Copied:
    """Copy ``src_path`` (as listed: ``info``) to ``dst_path`` on the server; ``src`` and
    ``dst`` are policy-wrapped S3 providers of one store and one key pair (the request
    goes through ``dst``). ``cutoff``: the largest object stored in one piece that one
    ``CopyObject`` copies (a larger one goes in ``part_size`` parts). ``check``: look at
    the copy's size after it is published. ``metadata``: upload arguments that replace the
    source's (``ContentType``, ``Metadata``, ...). ``advance(n)``: ``n`` more bytes are
    copied. ``in_place``: ``dst_path`` is ``src_path`` (its metadata changed: S3 takes
    such a copy only with ``metadata``); a copy that fails a check after it is published
    is then left as S3 made it, never deleted (it is the only one). ``lacks``: the ways
    (:data:`ONE_PIECE`, :data:`IN_PARTS`) this store said it has not: an object that
    needs one raises :class:`ServerCopyUnsupported` at once."""
    call = _Calls(dst, in_place=in_place)
    try:
        head = await _head_source(call, src_path, info)
    except ConfigurationError as exc:
        if isinstance(exc, WrongRegionError | MissingCredentialsError):
            raise
        # A HEAD's bare 400 says no reason (an SSE-C object read without its key is one):
        # the streamed copy's read gets S3's reason in its body, or copies the object.
        raise ServerCopyUnsupported(f"S3 gave no reason for refusing the source's HEAD "
                                    f"({exc.message})", this_object=True) from exc
    etag = str(head.get("ETag") or "")
    size = int(head.get("ContentLength", info.size))
    if size != info.size:
        raise ObjectChangedError(f"the source is {size} bytes now, {info.size} when listed")
    if head.get("SSECustomerAlgorithm"):
        # The copy would need the customer's key for both sides: the streamed copy says why.
        raise ServerCopyUnsupported("the source is encrypted with a customer key (SSE-C)",
                                    this_object=True)
    if not etag:  # (every S3 answer names one; a copy that pins nothing is not ours)
        raise ServerCopyUnsupported("the source's HEAD names no ETag to pin the copy to",
                                    this_object=True)
    if (archived := _archived(head)) is not None:
        # S3 refuses the copy with a bare 403 (ObjectNotInActiveTierError), which read as
        # the destination's; aws s3 cp skips such objects with the same advice.
        raise PermissionDeniedError(
            f"the source is archived (storage class {archived}) and not restored: S3 copies "
            "it only once restored (aws s3api restore-object), then copy it again")
    # The ETag as an MD5 (of the bytes, or of the parts' MD5s, -N); under SSE-KMS it is not.
    md5 = _etag_md5(etag) if head.get("ServerSideEncryption") not in KMS_ENCRYPTION else None
    way = ONE_PIECE if size <= cutoff and (md5 is None or md5[1] is None) else IN_PARTS
    if way in lacks:
        raise ServerCopyUnsupported(f"the server does not support {way} (NotImplemented)",
                                    way=way)
    if way == ONE_PIECE:
        copied = await _copy_object(call, src_path, dst_path, etag, md5[0] if md5 else None,
                                    _replaced(head, metadata),
                                    kms_source=head.get("ServerSideEncryption") in KMS_ENCRYPTION)
        if advance is not None:
            advance(size)
    else:
        copied = await _copy_parts(call, src_path, dst_path, etag, md5, size,
                                   checked_carried({**carried_from_head(head),
                                                    **(metadata or {})}),
                                   part_size=part_size, concurrency=concurrency,
                                   advance=advance,
                                   kms_source=head.get("ServerSideEncryption") in KMS_ENCRYPTION)
    if check:
        await _check_size(call, dst_path, size)
    return copied


def _archived(head: dict[str, Any]) -> str | None:
    """The archive a source's HEAD says it is in and not restored from (its storage
    class, or Intelligent-Tiering's archive tier), else None."""
    restored = 'ongoing-request="false"' in str(head.get("Restore") or "").replace(" ", "")
    storage = str(head.get("StorageClass") or "")
    if storage in _ARCHIVES and not restored:
        return storage
    if head.get("ArchiveStatus") and not restored:  # (INTELLIGENT_TIERING's archive tiers)
        return f"{storage or 'INTELLIGENT_TIERING'}, {head['ArchiveStatus']}"
    return None


async def _head_source(call: _Calls, src_path: str, info: ObjectInfo) -> dict[str, Any]:
    bucket, key = _split(src_path)
    pinned: dict[str, Any] = {"IfMatch": info.etag} if info.etag else {}
    try:
        return await call("head_object", src_path, Bucket=bucket, Key=key, **pinned)
    except PermissionDeniedError as exc:
        raise PermissionDeniedError(f"reading the source was refused: {exc.message}") from exc


def _refused_writing(exc: PermissionDeniedError, *, kms_source: bool = False
                     ) -> PermissionDeniedError:
    if kms_source:  # (its HEAD needs no KMS permission; copying its bytes does)
        return PermissionDeniedError(
            f"the copy was refused: the key pair may lack kms:Decrypt on the source's KMS "
            f"key (it is encrypted with SSE-KMS) or s3:PutObject on the destination: "
            f"{exc.message}")
    # The HEAD of the source (s3:GetObject) went through with the same key pair.
    return PermissionDeniedError(
        f"writing the destination was refused (the source could be read with the same "
        f"credentials): {exc.message}")


def _replaced(head: dict[str, Any], metadata: dict[str, Any] | None) -> dict[str, Any]:
    """``CopyObject`` arguments for ``metadata`` set by the caller: none (S3 copies the
    source's) or ``REPLACE`` with every field, the source's under the caller's."""
    if not metadata:
        return {}
    fields = {k: v for k, v in checked_carried({**carried_from_head(head), **metadata}).items()
              if v}
    return {"MetadataDirective": "REPLACE", **fields}


async def _copy_object(call: _Calls, src_path: str, dst_path: str, etag: str,
                       md5: str | None, replaced: dict[str, Any], *,
                       kms_source: bool = False) -> Copied:
    """One ``CopyObject``: of a source stored in one piece, its copy's ETag is its MD5
    (``md5``; None: the source's ETag is no MD5, nothing to compare). ``replaced``:
    the metadata arguments when the caller set some (see :func:`_replaced`)."""
    bucket, key = _split(dst_path)
    source = dict(zip(("Bucket", "Key"), _split(src_path), strict=True))
    try:
        resp = await call("copy_object", dst_path, Bucket=bucket, Key=key, CopySource=source,
                          CopySourceIfMatch=etag, **replaced)
    except PermissionDeniedError as exc:
        raise _refused_writing(exc, kms_source=kms_source) from exc
    got = (resp.get("CopyObjectResult") or {}).get("ETag")
    if md5 is None or resp.get("ServerSideEncryption") in KMS_ENCRYPTION or _etag_md5(got) is None:
        return Copied(None)  # the destination's own encryption: its ETag is no MD5
    if _etag_md5(got) != (md5, None):
        then = await _remove(call, dst_path)
        raise ObjectChangedError(
            f"the copy's ETag {got} is not the source's {etag}: the source changed while it "
            f"was copied (or the server copied other bytes); {then}")
    return Copied("ETag")


async def _copy_parts(call: _Calls, src_path: str, dst_path: str, etag: str,
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
    bucket, key = _split(dst_path)
    carried = {k: v for k, v in carried.items() if v}
    sent = time.time()
    # Shielded: a cancellation (Ctrl-C) while S3 makes the upload still learns its id, to
    # abort it (S3 goes on with a request it has).
    create = asyncio.ensure_future(call("create_multipart_upload", dst_path, once=True,
                                        Bucket=bucket, Key=key, **carried))
    try:
        upload = await asyncio.shield(create)
    except asyncio.CancelledError:
        await asyncio.shield(_abort_created(call, dst_path, create))
        raise
    except PermissionDeniedError as exc:
        raise _refused_writing(exc) from exc
    except TensorstreamError as exc:
        if exc.temporary:  # applied, its answer lost? (S3 would keep it open)
            await asyncio.shield(abort_lost_upload(
                lambda op, **kw: call(op, dst_path, **kw), bucket, key, sent, time.time()))
        raise
    upload_id = str(upload.get("UploadId") or "")
    if not upload_id:
        raise IntegrityError("S3 answered CreateMultipartUpload without an UploadId")
    source = dict(zip(("Bucket", "Key"), _split(src_path), strict=True))
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
            raise _refused_writing(exc, kms_source=kms_source) from exc
        parts = [{"PartNumber": n, "ETag": etags[n]} for n in range(1, len(layout) + 1)]
        compared = (not own and md5 is not None and not encrypted[0]
                    and all(_etag_md5(p["ETag"]) for p in parts))
        if compared:
            assert md5 is not None
            made = hashlib.md5(b"".join(bytes.fromhex(_etag_md5(p["ETag"])[0])  # type: ignore[index]
                                        for p in parts)).hexdigest()
            if (made, len(parts)) != md5:
                raise ObjectChangedError(
                    f"the copied parts make the ETag \"{made}-{len(parts)}\", the source's is "
                    f"{etag}: the source changed while it was copied (or the server copied "
                    "other bytes); nothing was published")
        else:  # still the version the parts were pinned to
            await _head_source(call, src_path, ObjectInfo(path=src_path, size=size, etag=etag))
        try:
            done = await call("complete_multipart_upload", dst_path, once=True, Bucket=bucket,
                              Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except TensorstreamError as exc:
            # Applied, its answer lost (a timeout, a cut connection)? The copy holding the
            # source's ETag says so; otherwise the error stands and the upload is aborted.
            done = await _published_anyway(call, dst_path, md5 if compared else None,
                                           upload_id, len(parts), size, exc)
    except BaseException:
        await asyncio.shield(_abort(call, dst_path, upload_id))
        raise
    if compared and _etag_md5(done.get("ETag")) not in (None, md5):
        then = await _remove(call, dst_path)
        raise IntegrityError(f"the copy's ETag {done.get('ETag')} is not the source's {etag}; "
                             f"{then}")
    return Copied("ETag" if compared else None, len(parts))


async def _published_anyway(call: _Calls, dst_path: str,
                            md5: tuple[str, int | None] | None, upload_id: str,
                            parts: int, size: int,
                            error: TensorstreamError) -> dict[str, Any]:
    """The destination's HEAD if the failed complete (``error``) was applied, else
    ``error`` is raised. Applied: the object holds the ETag ``md5`` (the copy's); where
    no ETag can say (``md5`` None), the upload is gone (``NoSuchUpload``) and the object
    holds ``size`` bytes in ``parts`` parts."""
    bucket, key = _split(dst_path)
    if md5 is None:
        gone = False
        try:
            await call("list_parts", dst_path, Bucket=bucket, Key=key, UploadId=upload_id,
                       MaxParts=1)
        except NotFoundError:
            gone = True  # completed (or aborted by another)
        except TensorstreamError:
            pass
        if not gone:  # still open (not applied), or it cannot be told
            raise error
    try:
        head = await call("head_object", dst_path, Bucket=bucket, Key=key)
    except TensorstreamError:
        head = {}
    tag = str(head.get("ETag") or "").strip('"')
    if (_etag_md5(tag) == md5) if md5 is not None else (
            tag.endswith(f"-{parts}") and int(head.get("ContentLength", -1)) == size):
        log.info("CompleteMultipartUpload of %s failed, but the object holds the copy "
                 "(ETag %s): it was applied", redact_text(dst_path), head.get("ETag"))
        return head
    raise error


async def _source_layout(call: _Calls, src_path: str, etag: str, count: int,
                         size: int) -> list[tuple[int, int]] | None:
    """The byte range of each of the source's ``count`` parts (``HEAD ?partNumber=N``,
    pinned to ``etag``); None where the server does not say (the copy then uses its
    own layout and cannot compare ETags)."""
    if not 1 <= count <= MAX_PARTS:
        return None
    bucket, key = _split(src_path)
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
    """``(start, end)`` of ``bytes A-B/SIZE`` (None if it is not that, for ``size``)."""
    unit, _, rest = text.partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or total != str(size) or not (first.isdigit() and last.isdigit()):
        return None
    return int(first), int(last) + 1


async def _abort_created(call: _Calls, dst_path: str,
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


async def _abort(call: _Calls, dst_path: str, upload_id: str) -> None:
    """Abort the upload, again while it is still listed (a part S3 was copying when the
    abort came may land after it: AWS's advice is to abort again)."""
    bucket, key = _split(dst_path)
    for _ in range(3):
        try:
            await call("abort_multipart_upload", dst_path, Bucket=bucket, Key=key,
                       UploadId=upload_id)
            await call("list_parts", dst_path, Bucket=bucket, Key=key, UploadId=upload_id,
                       MaxParts=1)
        except TensorstreamError:
            return  # gone (NoSuchUpload), or the copy's own error is the one to report
    log.warning("%s: the multipart upload %s is still listed after three aborts (a lifecycle "
                "rule for incomplete uploads removes it)", redact_text(dst_path), upload_id)


async def _remove(call: _Calls, dst_path: str) -> str:
    """Delete a published copy that failed a check; what became of it, for the error."""
    if call.in_place:
        return "it is the object itself (changed in place), left as S3 made it"
    bucket, key = _split(dst_path)
    try:
        await call("delete_object", dst_path, Bucket=bucket, Key=key)
    except TensorstreamError:
        pass
    return "the copy was removed"


async def _check_size(call: _Calls, dst_path: str, size: int) -> None:
    bucket, key = _split(dst_path)
    got = int((await call("head_object", dst_path, Bucket=bucket, Key=key))
              .get("ContentLength", -1))
    if got != size:
        then = await _remove(call, dst_path)
        raise IntegrityError(f"the copy is {got} bytes, the source {size}; {then}")
