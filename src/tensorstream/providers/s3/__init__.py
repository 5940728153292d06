"""S3 service: ranged GETs on the shared HTTP engine, botocore signing and credentials (docs/s3.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .provider import (
        S3Provider,
    )

__all__ = [
    "S3Provider",
]


# Lazy: importing the package (or its light config module) must not import the client library.
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "provider"))
