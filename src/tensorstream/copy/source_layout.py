"""The parts of a streamed S3 -> S3 copy, in the source's own layout where S3 tells it.

An object uploaded in parts has the ETag ``MD5-of-part-MD5s-N``: a copy written in
parts of another size has another ETag for the same bytes (3 x 8 MiB vs 10, 10 and
4 MiB: both ``-3``), and ``sync`` could not tell it from a change. So a copy of such a
source asks S3 for its first part (``HEAD ?partNumber=1``: its size and the parts
count, pinned to the listed ETag) and writes parts of that size, the last smaller, as
every uploader makes them: the copy's ETag is then the source's. A copy by S3 follows
the source's layout the same way (:mod:`tensorstream.providers.s3.server_copy_parts`).

Not followed (the copy is written in ``--part-size`` parts, as before; ``sync`` then
judges it by its size and dates): a source in one piece or one part, a layout that
equal parts of part 1's size do not make (parts of unequal sizes, a count that does not
fit), parts under S3's 5 MiB or over ``--part-size``, which bounds the copy's memory
(the pool's buffers hold the parts: a source in 5 GiB parts is copied in ours), or no
answer. ``--part-size`` is thus the largest part a streamed copy holds; the source's
layout wins where its parts are no larger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..providers.s3.etags import etag_md5
from ..providers.s3.parts import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE

if TYPE_CHECKING:
    from .job import Job

__all__ = ["follows", "source_part_size"]


def follows(size: int, part: int, parts: int, *, most: int) -> bool:
    """Whether parts of ``part`` bytes (the last smaller) make ``parts`` parts of a
    ``size``-byte object within S3's limits and at most ``most`` bytes each.

    >>> MiB = 1 << 20
    >>> follows(20 * MiB, 8 * MiB, 3, most=10 * MiB), follows(20 * MiB, 8 * MiB, 3, most=8 * MiB)
    (True, True)
    >>> follows(20 * MiB, 6 * MiB, 3, most=10 * MiB), follows(25 * MiB, 12 * MiB, 3, most=10 * MiB)
    (False, False)
    """
    return (2 <= parts <= MAX_PARTS and MIN_PART_SIZE <= part <= min(most, MAX_PART_SIZE)
            and -(-size // part) == parts)


async def source_part_size(job: Job, most: int) -> int | None:
    """The part size that writes ``job``'s copy in its source's layout (an S3 object
    uploaded in parts, copied to S3 through this machine), or None: use ours."""
    if job.src_uri.scheme != "s3" or job.dst_uri.scheme != "s3":
        return None
    md5 = etag_md5(job.info.etag)
    if md5 is None or md5[1] is None or md5[1] < 2:
        return None  # one piece (or one part, which our one PutObject cannot make)
    ask = getattr(getattr(job.src, "inner", None), "first_part", None)
    if ask is None:
        return None
    told = await ask(job.src_path, str(job.info.etag))
    if told is None or told[1] != md5[1]:
        return None
    part, parts = told
    return part if follows(job.info.size, part, parts, most=most) else None
