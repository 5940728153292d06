"""Import helpers: old module paths kept importable for one release, lazy package exports."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["alias_module", "lazy_exports"]


def alias_module(old: str, new: str) -> None:
    """Make ``import old`` return the module ``new`` (with a ``DeprecationWarning``)."""
    warnings.warn(
        f"{old} moved to {new}; the old path goes away in tensorstream 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for ``package`` that imports ``name`` from the
    submodule ``where[name]`` on first use, so importing the package stays light."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    return __getattr__
