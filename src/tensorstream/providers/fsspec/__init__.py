"""The fallback for any other fsspec protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .provider import (
        FsspecProvider,
    )

__all__ = [
    "FsspecProvider",
]


# Lazy: importing the package (or its light config module) must not import the client library.
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "provider"))
