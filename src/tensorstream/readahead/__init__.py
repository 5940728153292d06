"""The read-ahead engine behind the seekable file: ranged read-ahead and streamed reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .ranged import (
        Prefetcher,
    )

__all__ = [
    "Prefetcher",
]


# Lazy: importing the package (or its light config module) must not import the client library.
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "ranged"))
