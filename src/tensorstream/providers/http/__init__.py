"""HTTP(S) service: ranged GETs over one connection pool (docs/http.md)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .provider import (
        MAX_REDIRECTS,
        HTTPProvider,
        InsecureTLSWarning,
    )

__all__ = [
    "HTTPProvider",
    "InsecureTLSWarning",
    "MAX_REDIRECTS",
]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (or its light config module) must not import the client library.
    if name in __all__:
        value = getattr(importlib.import_module(f"{__name__}.provider"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
