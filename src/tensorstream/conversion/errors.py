"""What a conversion refuses, beyond tensorstream's own errors."""

from __future__ import annotations

from ..errors import TensorstreamError

__all__ = ["DestinationExistsError", "UnsupportedDtypeError"]


class DestinationExistsError(TensorstreamError, FileExistsError):
    """The destination already exists and ``overwrite`` was not given."""


class UnsupportedDtypeError(TensorstreamError, TypeError):
    """A tensor whose dtype (or emptiness, name or number of dimensions) the target format
    cannot hold or read back.

    Raised before anything is written; the message names the tensor and the dtype.
    """
