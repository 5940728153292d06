"""The S3 requests of a copy S3 makes itself (:mod:`.server_copy`) and what it ends in.

:class:`Calls` sends them with the provider's retry policy and error context, a
``501`` turned into :class:`ServerCopyUnsupported` first (the caller then streams
the copy); :class:`Copied` says what was compared. The steps both ways of copying
take are here too: the source's pinned ``HEAD``, what a refused write says, and the
removal of a published copy that failed a check.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ..._log_redaction import scrub_chain
from ...errors import PermissionDeniedError, TensorstreamError, UnsupportedOperationError
from ...uri import redact_text
from ..base import ObjectInfo
from .cleanup import delete_written, not_implemented
from .tags import encode_tags

__all__ = ["IN_PARTS", "ONE_PIECE", "Calls", "Copied", "ServerCopyUnsupported", "head_source",
           "refused_writing", "remove", "source_tags", "split"]

log = logging.getLogger("tensorstream.s3")

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
    #: The version the copy wrote (a versioned bucket): what a failed check removes.
    version_id: str | None = None
    #: The ETag the copy has: what a failed check removes where no version is named.
    etag: str | None = None


def split(path: str) -> tuple[str, str]:
    """``bucket/key`` as ``(bucket, key)``."""
    bucket, _, key = path.partition("/")
    return bucket, key


class Calls:
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

    async def _once(self, op: str, path: str, kwargs: dict[str, Any],
                    failed: list[tuple[float, float, TensorstreamError]] | None = None
                    ) -> dict[str, Any]:
        sent = time.time()
        try:
            return dict(await self.s3._call(op, path, **kwargs))
        except TensorstreamError as exc:
            if failed is not None:
                failed.append((sent, time.time(), exc))
            if not_implemented(exc):
                way = _WAY.get(op)
                raise ServerCopyUnsupported(
                    f"the server does not support {way or op} (NotImplemented)",
                    way=way) from exc
            raise

    async def __call__(self, op: str, path: str, *, once: bool = False,
                       failed: list[tuple[float, float, TensorstreamError]] | None = None,
                       **kwargs: Any) -> dict[str, Any]:
        """``op`` (a botocore operation) with ``kwargs``, sent again on a temporary error
        unless ``once`` (what publishes is sent once, as the writer sends it: an answer
        lost after S3 applied it is looked at instead). ``failed``: each failed try's send
        and failure times (``time.time()``) and error are added to it (a create whose
        answer was lost may have made an upload to abort)."""
        try:
            try:
                return await self._once(op, path, kwargs, failed)
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
                        error, first = first, None
                        raise error
                    return await self._once(op, path, kwargs, failed)
        except TensorstreamError as exc:
            exc.with_context(service="s3", operation=op, path=redact_text(path))
            scrub_chain(exc)  # (third-party causes hold request URLs and headers)
            raise
        raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover


async def head_source(call: Calls, src_path: str, info: ObjectInfo) -> dict[str, Any]:
    bucket, key = split(src_path)
    pinned: dict[str, Any] = {"IfMatch": info.etag} if info.etag else {}
    try:
        return await call("head_object", src_path, Bucket=bucket, Key=key, **pinned)
    except PermissionDeniedError as exc:
        raise PermissionDeniedError(f"reading the source was refused: {exc.message}") from exc


def refused_writing(exc: PermissionDeniedError, *, kms_source: bool = False
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


async def remove(call: Calls, dst_path: str, version_id: str | None = None,
                 etag: str | None = None) -> str:
    """Delete a published copy that failed a check; what became of it, for the error.
    Exactly what the copy wrote is deleted (:func:`.cleanup.delete_written`): the
    version it wrote (``version_id``; ``null`` in a suspended bucket), else the object
    while it still holds the copy's ``etag``; deleted by key, a delete marker would hide
    what the destination held before, and another writer's object stored since would go."""
    if call.in_place:
        return "it is the object itself (changed in place), left as S3 made it"
    bucket, key = split(dst_path)
    try:
        gone = await delete_written(lambda op, **kw: call(op, dst_path, **kw), bucket, key,
                                    version_id, etag)
    except TensorstreamError as exc:
        return f"the copy could not be removed ({exc.message}): it is there"
    if not gone:
        return "the destination holds another writer's object since (left as it is)"
    return "the copy was removed"


async def source_tags(call: Calls, src_path: str, *, nothing: str) -> dict[str, Any]:
    """``Tagging`` for a new object (an upload, or a streamed copy's ``PutObject``) that
    keeps the tags of the object at ``src_path``, read with ``call``'s key pair. Tags
    that cannot be read refuse the copy, as ``aws s3 cp`` fails it (``nothing`` says what
    became of it); a store without tags (501, as R2) holds none to keep, and neither do
    tags refused to a source read without a key pair (a public object's bytes are public,
    its tags not: refusing left no way to copy it at all), said in a warning."""
    bucket, key = split(src_path)
    try:
        answer = await call("get_object_tagging", src_path, Bucket=bucket, Key=key)
    except ServerCopyUnsupported:
        return {}
    except PermissionDeniedError as exc:
        if getattr(getattr(call.s3, "credentials", None), "anonymous", False):
            log.warning("%s: its tags may not be read without a key pair (anonymous source; "
                        "s3:GetObjectTagging): copied without them", redact_text(src_path))
            return {}
        raise PermissionDeniedError(
            f"its tags could not be read to keep them (s3:GetObjectTagging on the source): "
            f"{exc.message}; {nothing} (--copy-props metadata-directive, or "
            "copy_props=, leaves the tags out)") from exc
    tags = [(t["Key"], t["Value"]) for t in answer.get("TagSet") or ()]
    return {"Tagging": encode_tags(tags)} if tags else {}
