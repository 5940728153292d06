"""Objects uploaded in parts, as aws s3 cp, s5cmd and rclone store large ones; an
upload in parts whose first part is held while the second is refused."""

from __future__ import annotations

import asyncio
from typing import Any


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
