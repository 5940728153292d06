"""The bytes a tensorizer load would allocate, checked before it allocates them.

tensorizer allocates each tensor from what the file's index claims. A tensor
with data is bounded by the file (:class:`~.checked.CheckedSource` checks its
length against the object), but a *meta* tensor (written without data,
loaded as zeros of its shape) costs nothing in the file: a 262 KB file
claiming 16 GiB made a load allocate and zero 16 GiB. tensorizer also sizes
it with ``numpy.prod``, which wraps around silently on a huge shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy
from tensorizer.serialization import OPAQUE_DTYPE_SEP

from ..errors import MalformedFileError
from ..headroom import check_fits, size_text

__all__ = ["check_claims", "claimed_bytes"]


def claimed_bytes(entry: Any, name: str) -> int:
    """What loading ``entry`` (a tensorizer ``TensorEntry``) allocates, exactly
    (Python integers: no overflow). Raises :class:`MalformedFileError` naming
    ``name`` for a dtype numpy does not know."""
    if entry.data_length > 0:
        return int(entry.data_length)
    try:
        itemsize = numpy.dtype(str(entry.dtype).split(OPAQUE_DTYPE_SEP, 1)[0]).itemsize
    except (TypeError, ValueError):
        raise MalformedFileError(f"{name} is not a whole tensorizer file: its index gives "
                                 f"tensor {entry.name} the unknown dtype {entry.dtype!r}") from None
    claimed = itemsize * math.prod(int(d) for d in entry.shape)
    if claimed >= 1 << 63:  # no tensor holds that; tensorizer's int64 numpy.prod wraps around
        raise MalformedFileError(
            f"{name} is not a whole tensorizer file: its index gives meta tensor {entry.name} "
            f"shape {tuple(entry.shape)} x {entry.dtype}, {claimed} bytes, more than any "
            "tensor can hold (2**63)")
    return claimed


def check_claims(entries: Iterable[Any], device: Any, limit: int | None, name: str) -> int:
    """Refuse, before anything is allocated, to load ``entries`` onto ``device``
    when they claim more than ``limit`` bytes (``None``: what the device has
    available now, :func:`~tensorstream.headroom.available_bytes`); the bytes they
    claim otherwise."""
    entries = list(entries)
    claims = [claimed_bytes(e, name) for e in entries]
    meta = sum(c for e, c in zip(entries, claims, strict=True) if e.data_length <= 0)
    check_fits(sum(claims), device, limit, name, count=len(entries),
               detail=(f", {size_text(meta)} of it in meta tensors (zeros, without data in the "
                       "file)") if meta else "",
               fewer="filter_func, lazy_load")
    return sum(claims)
