"""Objects uploaded in parts, as aws s3 cp, s5cmd and rclone store large ones; an
upload in parts whose first part is held while the second is refused; a copy cancelled
(Ctrl-C) while one of its requests is held."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest


def put_in_parts(backend: Any, key: str, parts: list[bytes], **extra: Any) -> str:
    """Upload ``parts`` to ``backend`` (a plugin S3 backend) as one multipart object
    (``extra``: CreateMultipartUpload's other arguments); its ETag."""
    c = backend.client
    upload = c.create_multipart_upload(Bucket=backend.bucket, Key=key, **extra)["UploadId"]
    done = [{"PartNumber": n, "ETag": c.upload_part(Bucket=backend.bucket, Key=key,
                                                    UploadId=upload, PartNumber=n,
                                                    Body=body)["ETag"]}
            for n, body in enumerate(parts, 1)]
    return str(c.complete_multipart_upload(Bucket=backend.bucket, Key=key, UploadId=upload,
                                           MultipartUpload={"Parts": done})["ETag"])


def hold_one_part(backend: Any, key: str) -> None:
    """Through ``backend``'s fault proxy (a plugin S3 backend), for the object ``key``:
    CreateMultipartUpload answered, then the first part held a second, the second
    refused (403); the proxy's log cleared."""
    backend.faults.raw.path_prefix = f"/{backend.bucket}/{key}"
    backend.faults.raw.status_script = [200, 200, 403]
    held: list[str] = []

    async def hold_the_first_part(method: str, path: str) -> None:
        if method == "PUT" and not held:
            held.append(path)
            await asyncio.sleep(1.0)

    backend.faults.raw.before_forward = hold_the_first_part
    backend.proxy.clear_log()


def copy_cancelled_while_held(backend: Any, src: str, key: str, method: str, *,
                              once: bool = False, **options: Any) -> Any:
    """Copy ``src`` to ``key`` of ``backend`` (a plugin S3 backend) and cancel the copy's
    task, as Ctrl-C does, while a ``method`` request for ``key`` is held a second at the
    fault proxy (each such request; ``once``: the first only). The copy's ``CopyResult``."""
    from tensorstream.copy.engine import CopyResult, copy_async

    path = f"/{backend.bucket}/{key}"
    holding = threading.Event()

    async def hold(method_: str, path_: str) -> None:
        if method_ == method and path_ == path and not (once and holding.is_set()):
            holding.set()
            await asyncio.sleep(1.0)

    backend.faults.raw.before_forward = hold
    result = CopyResult()

    async def main() -> None:
        task = asyncio.ensure_future(copy_async(src, backend.uri(key), result=result,
                                                **{**backend.options, **options}))
        assert await asyncio.to_thread(holding.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return result
