"""The read-ahead engine behind the seekable file: ranged read-ahead and streamed reads."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .ranged import (
        Prefetcher,
    )

__all__ = [
    "Prefetcher",
]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (or its light config module) must not import the client library.
    if name in __all__:
        value = getattr(importlib.import_module(f"{__name__}.ranged"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
