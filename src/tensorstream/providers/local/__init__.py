"""Local disk: positional reads with os.preadv, atomic writes by rename (docs/providers.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .provider import (
        LocalProvider,
        map_local_error,
        temp_path_for,
    )

__all__ = [
    "LocalProvider",
    "map_local_error",
    "temp_path_for",
]


# Lazy: importing the package (or its light config module) must not import the client library.
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "provider"))
