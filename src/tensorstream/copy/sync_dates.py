"""Dates of whole seconds (S3's ``LastModified``) against a local file's nanoseconds.

A copy in S3 is dated at the start of the second S3 took it, its local source to the
nanosecond: a file written in the second of its upload looked newer than its copy, and
``sync`` copied it again (``aws s3 sync`` does too). :func:`in_its_second` says when the
dates cannot tell (the source dated within the destination's second); :func:`etag_says`
then compares the file's bytes with the copy's ETag, where that is an MD5 (of the whole,
or of its parts in a part size known here): a file rewritten with the same size in that
second is told from one untouched. Where the ETag cannot say (SSE-KMS, DSSE-KMS, SSE-C, or
parts of an unknown size), the file is taken as changed: copied once more, never skipped.
"""

from __future__ import annotations

import datetime
import hashlib
import re

from ..providers._http.threads import in_thread
from ..providers.base import ObjectInfo
from ..providers.s3.parts import known_size_part

__all__ = ["etag_says", "in_its_second"]

_MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})(?:-(\d+))?"?$')
#: Part sizes a copy in parts may have been made with, besides this copy's: aws s3 cp's.
_OTHER_PART_SIZES = (8 << 20,)
_CHUNK = 8 << 20
_SECOND = datetime.timedelta(seconds=1)


def in_its_second(src: ObjectInfo, dst: ObjectInfo) -> bool:
    """Whether ``dst``'s date is a whole second and ``src``'s falls inside it (after its
    start): the dates alone cannot tell whether ``src`` changed after the copy."""
    if src.mtime is None or dst.mtime is None or dst.mtime.microsecond:
        return False
    return dst.mtime < src.mtime < dst.mtime + _SECOND


async def etag_says(path: str, src: ObjectInfo, dst: ObjectInfo, part_size: int) -> bool | None:
    """Whether the local file at ``path`` holds the bytes whose MD5 ``dst``'s ETag is
    (True: the same; False: others), None where the ETag cannot say (not an MD5, or parts
    of a size not known here). Reads the file once."""
    m = _MD5_ETAG.match(dst.etag or "")
    if m is None or dst.extra.get("etag_not_md5") is True or src.size != dst.size:
        return None
    want, count = m.group(1).lower(), int(m.group(2)) if m.group(2) else None
    part = None
    if count is not None:
        sizes = (known_size_part(src.size, p) for p in (part_size, *_OTHER_PART_SIZES))
        part = next((p for p in sizes if -(-src.size // p) == count), None)
        if part is None:
            return None
    return await in_thread(lambda: _md5_of(path, part) == want)


def _md5_of(path: str, part: int | None) -> str:
    """The file's MD5 hex, or (``part``) the MD5 of its parts' MD5s, as S3 makes ETags."""
    whole, digests = hashlib.md5(), []
    current, left = hashlib.md5(), part
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK if left is None else min(_CHUNK, left)):
            if part is None:
                whole.update(chunk)
                continue
            current.update(chunk)
            left -= len(chunk)  # type: ignore[operator]
            if left == 0:
                digests.append(current.digest())
                current, left = hashlib.md5(), part
    if part is None:
        return whole.hexdigest()
    if left != part:
        digests.append(current.digest())
    return hashlib.md5(b"".join(digests)).hexdigest()
