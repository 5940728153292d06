"""Old module paths that moved, kept importable for one release with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings

__all__ = ["alias_module"]


def alias_module(old: str, new: str) -> None:
    """Make ``import old`` return the module ``new`` (with a ``DeprecationWarning``)."""
    warnings.warn(
        f"{old} moved to {new}; the old path goes away in tensorstream 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
