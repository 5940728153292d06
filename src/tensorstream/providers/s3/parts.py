"""S3's multipart limits and the part sizes chosen under them.

S3 takes at most 10,000 parts per upload, each at least 5 MiB (all but the
last) and at most 5 GiB, for an object of at most 5 TiB. A write whose size is
known (``cp``) divides it; a streaming write (``open(uri, "wb")``,
``serialize``) does not know its size, so its parts grow as it goes: every
:data:`GROW_EVERY` parts the part size doubles. From the smallest part (5 MiB),
10,000 parts then hold more than 5 TiB (:func:`streaming_capacity`).
"""

from __future__ import annotations

from ...errors import UnsupportedOperationError

__all__ = [
    "GROW_EVERY", "MAX_OBJECT_SIZE", "MAX_PARTS", "MAX_PART_SIZE", "MIN_PART_SIZE",
    "check_object_size", "known_size_part", "streaming_capacity", "streaming_part_size",
]

MIN_PART_SIZE = 5 << 20  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 << 30
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 << 40
#: Parts between doublings of a streaming write's part size. 1000 held only
#: 4.88 TiB in 10,000 parts of 5 MiB and up (part 10,001 failed after hours);
#: 900 holds 9 TiB.
GROW_EVERY = 900


def streaming_part_size(index: int, base: int, grow_every: int = GROW_EVERY) -> int:
    """Size of part ``index`` (0-based) of a write of unknown size whose first
    parts are ``base`` bytes (at least 5 MiB, at most 5 GiB)."""
    first = min(max(base, MIN_PART_SIZE), MAX_PART_SIZE)
    return min(first << min(index // grow_every, 40), MAX_PART_SIZE)


def streaming_capacity(base: int, parts: int = MAX_PARTS, grow_every: int = GROW_EVERY) -> int:
    """Bytes that ``parts`` parts of a streaming write starting at ``base`` hold."""
    total, index = 0, 0
    while index < parts:
        run = min(grow_every - index % grow_every, parts - index)  # parts of one size
        total += run * streaming_part_size(index, base, grow_every)
        index += run
    return total


def check_object_size(size: int, path: str) -> None:
    """Raise before anything is sent when S3 cannot store ``size`` bytes."""
    if size > MAX_OBJECT_SIZE:
        raise UnsupportedOperationError(
            f"{size} bytes is more than S3 stores in one object (5 TiB = {MAX_OBJECT_SIZE} "
            "bytes); split it into several objects (shards)", service="s3", path=path)


def known_size_part(total: int, wanted: int, max_parts: int = MAX_PARTS) -> int:
    """The part size for an object of ``total`` bytes, near ``wanted``: at least
    5 MiB and large enough that the parts number at most ``max_parts``."""
    return min(max(wanted, MIN_PART_SIZE, -(-total // max_parts)), MAX_PART_SIZE)
