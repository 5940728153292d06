"""A multipart upload aborted so that nothing of it is left, for the writer
(:mod:`.writer`) and the copy by S3 (:mod:`.server_copy_parts`) alike: aborted again
while S3 still lists it, and a warning naming the upload when one is left."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import TensorstreamError
from ...uri import redact_text

__all__ = ["ABORTS", "abort_again", "not_aborted"]

log = logging.getLogger("tensorstream.s3")

#: Aborts sent in all, at most, while ``ListParts`` still finds the upload.
ABORTS = 3


def not_aborted(bucket: str, key: str, upload_id: str, exc: BaseException) -> None:
    """Say that ``upload_id`` could not be aborted (``exc``), and what removes it."""
    log.warning("could not abort multipart upload %s of %s: %s (a bucket lifecycle rule for "
                "incomplete uploads removes it)", upload_id, redact_text(f"{bucket}/{key}"), exc)


async def abort_again(call: Callable[..., Awaitable[Any]], bucket: str, key: str,
                      upload_id: str) -> None:
    """After an abort S3 took: abort again while ``ListParts`` still finds the upload (a
    part S3 was storing when the abort came may land after it: AWS's advice), up to
    :data:`ABORTS` aborts in all; a warning names an upload still listed or an abort
    refused. ``call(op, **kwargs)`` sends one request."""
    ids = {"Bucket": bucket, "Key": key, "UploadId": upload_id}
    for sent in range(1, ABORTS + 1):
        try:
            await call("list_parts", MaxParts=1, **ids)
        except TensorstreamError:
            return  # gone (NoSuchUpload), or not to be asked: as good as it gets
        if sent == ABORTS:
            break
        try:
            await call("abort_multipart_upload", **ids)
        except TensorstreamError as exc:
            not_aborted(bucket, key, upload_id, exc)
            return
    log.warning("%s: the multipart upload %s is still listed after %d aborts (a lifecycle "
                "rule for incomplete uploads removes it)", redact_text(f"{bucket}/{key}"),
                upload_id, ABORTS)
