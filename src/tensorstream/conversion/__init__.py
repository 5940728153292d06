"""Convert checkpoints between safetensors and tensorizer, tensor by tensor, on any backend.

Imported lazily (torch and tensorizer are heavy): ``tensorstream.convert``
resolves on first use. See docs/convert.md.

>>> import tensorstream
>>> tensorstream.convert("s3://bucket/llama/", "s3://bucket/llama.tensors")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .api import ConvertResult, convert
    from .errors import DestinationExistsError, UnsupportedDtypeError

_WHERE = {
    "ConvertResult": "api",
    "DestinationExistsError": "errors",
    "UnsupportedDtypeError": "errors",
    "convert": "api",
}

__all__ = ["ConvertResult", "DestinationExistsError", "UnsupportedDtypeError", "convert"]


__getattr__ = lazy_exports(__name__, _WHERE)
