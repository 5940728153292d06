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

from ..errors import InsufficientMemoryError, MalformedFileError
from ..headroom import available_bytes

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
    return itemsize * math.prod(int(d) for d in entry.shape)


def _size(n: int) -> str:
    return f"{n} bytes ({n / (1 << 30):.3g} GiB)" if n >= 1 << 20 else f"{n} bytes"


def check_claims(entries: Iterable[Any], device: Any, limit: int | None, name: str) -> None:
    """Refuse, before anything is allocated, to load ``entries`` onto ``device``
    when they claim more than ``limit`` bytes (``None``: what the device has
    available now, :func:`~tensorstream.headroom.available_bytes`)."""
    entries = list(entries)
    claims = [claimed_bytes(e, name) for e in entries]
    total = sum(claims)
    if limit is None:
        if not total:
            return
        limit = available_bytes(device)
        if limit is None:  # unknown: never refuse on a guess
            return
        given = False
    else:
        given = True
    if total <= limit:
        return
    meta = sum(c for e, c in zip(entries, claims, strict=True) if e.data_length <= 0)
    detail = (f", {_size(meta)} of it in meta tensors (zeros, without data in the file)"
              if meta else "")
    where = (f"the allowance max_tensor_bytes={limit}" if given
             else f"the {_size(limit)} {getattr(device, 'type', device)} memory available")
    raise InsufficientMemoryError(
        f"{name}: its {len(entries)} tensor(s) to load claim {_size(total)}{detail}, more than "
        f"{where}; nothing was allocated. If the file is right and the memory will be there, "
        "pass max_tensor_bytes= the bytes to allow (e.g. '64GiB'), or load fewer tensors "
        "(filter_func, lazy_load)", claimed=total, limit=limit)
