"""When S3's ETag is the MD5 of what it stores.

An object stored in one piece has the MD5 of its bytes as its ETag, one uploaded in
``N`` parts the MD5 of its parts' MD5s, ``-N``: what a write or a copy by S3 compares
with digests of the source's bytes, and what tells ``sync`` whether two ETags can decide
(:mod:`tensorstream.copy.select`: equal, or of one piece each). Not under SSE-KMS
(:data:`KMS_ENCRYPTION`) or SSE-C, whose ETags have the shape but are no MD5.
"""

from __future__ import annotations

import re

__all__ = ["KMS_ENCRYPTION", "etag_md5"]

_MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})(?:-(\d+))?"?$')

#: Server-side encryption (``x-amz-server-side-encryption``) under which S3's ETag
#: is not the MD5 of the bytes.
KMS_ENCRYPTION = frozenset({"aws:kms", "aws:kms:dsse"})


def etag_md5(etag: object) -> tuple[str, int | None] | None:
    """``(md5 hex, part count or None)`` of an ETag that has the MD5 shape."""
    m = _MD5_ETAG.match(str(etag or ""))
    if m is None:
        return None
    return m.group(1).lower(), int(m.group(2)) if m.group(2) else None
