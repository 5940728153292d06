"""Objects uploaded in parts, as aws s3 cp, s5cmd and rclone store large ones."""

from __future__ import annotations

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
