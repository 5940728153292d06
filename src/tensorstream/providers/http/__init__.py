"""HTTP(S) service: ranged GETs over one connection pool (docs/http.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._compat import lazy_exports

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


# Lazy: importing the package (or its light config module) must not import the client library.
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "provider"))
