"""The pinning layer: every read of an object is of one version, or raises
:class:`~tensorstream.errors.ObjectChangedError`.

Providers that declare ``capabilities.pinned_reads`` enforce a
:class:`~tensorstream.providers.base.Pin` themselves, with the validators
sent in the read request itself (no extra request on the hot path): ETag and
``If-Match`` where the backend gives ETags, else Last-Modified and
``If-Unmodified-Since``, and always the total size of each answer.

For the others this layer pins by ``stat``: it takes the version before the
read (the caller's pin, or a ``stat`` of its own) and compares a ``stat``
after it. Bytes received before a break are only kept (resumed) when the
version can be told apart by more than the size; otherwise the read starts
over, so it never stitches two versions together.
"""

from __future__ import annotations

from typing import Any

from ..errors import TensorstreamError
from ..providers.base import Pin

__all__ = ["merge", "resume_pin", "served_pin"]


def served_pin(exc: BaseException) -> Pin | None:
    """The version the bytes of a broken answer came from, if the provider said."""
    served: Any = getattr(exc, "served", None)
    return served if isinstance(served, Pin) else None


def merge(pin: Pin | None, other: Pin | None) -> Pin | None:
    """``pin`` with its unknown fields filled from ``other``."""
    if pin is None or other is None:
        return pin or other
    return Pin(size=pin.size if pin.size is not None else other.size,
               etag=pin.etag if pin.etag is not None else other.etag,
               mtime=pin.mtime if pin.mtime is not None else other.mtime)


def resume_pin(pin: Pin | None, exc: TensorstreamError) -> Pin | None:
    """The pin a read resumed after ``exc`` must use, or ``None`` when the bytes
    already received cannot be kept: the version they came from cannot be
    told apart from another one (no ETag and no Last-Modified known)."""
    merged = merge(pin, served_pin(exc))
    if merged is None or not merged.validated:
        return None
    return merged
