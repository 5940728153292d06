"""Layers wrapped around any provider (OpenDAL-style): each concern written
once, for every backend and every read path.

* :mod:`.stack` -- :class:`PolicyProvider`, the composed stack: error context,
  retry, resume, capability checks, metrics; it runs every attempt under
* :mod:`.timeout` -- total and idle deadlines enforced *inside* an attempt, and
* :mod:`.pinning` -- every read of an object pinned to one version.
"""

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
