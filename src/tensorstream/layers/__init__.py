"""Layers wrapped around any provider (OpenDAL-style): each concern written
once, for every backend and every read path.

* :mod:`.stack` -- :class:`PolicyProvider`, the composed stack: error context,
  retry, resume, capability checks, metrics (the stream and the writer it hands
  out: :mod:`.counted_body`, :mod:`.context_writer`); it runs every attempt under
* :mod:`.timeout` -- total and idle deadlines enforced *inside* an attempt, and
* :mod:`.pinning` -- every read of an object pinned to one version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .stack import (
        Metrics,
        PolicyProvider,
    )

__all__ = [
    "Metrics",
    "PolicyProvider",
]


# Lazy: importing the package (or its light config module) must not import the client library.
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "stack"))
