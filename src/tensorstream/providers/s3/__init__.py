"""S3 service: ranged GETs on the shared HTTP engine, botocore signing and credentials (docs/s3.md)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .provider import (
        S3Provider,
    )

__all__ = [
    "S3Provider",
]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (or its light config module) must not import the client library.
    if name in __all__:
        value = getattr(importlib.import_module(f"{__name__}.provider"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
