"""Policy wrapped around any provider: error context, retry, resume, metrics."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .stack import (
        Metrics,
        PolicyProvider,
    )

__all__ = [
    "Metrics",
    "PolicyProvider",
]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (or its light config module) must not import the client library.
    if name in __all__:
        value = getattr(importlib.import_module(f"{__name__}.stack"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
