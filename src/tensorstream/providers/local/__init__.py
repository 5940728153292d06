"""Local disk: positional reads with os.preadv, atomic writes by rename (docs/providers.md)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (or its light config module) must not import the client library.
    if name in __all__:
        value = getattr(importlib.import_module(f"{__name__}.provider"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
