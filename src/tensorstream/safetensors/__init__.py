"""safetensors front door: load safetensors files and sharded checkpoints from any backend.

Imported lazily (torch is heavy): ``tensorstream.safetensors`` resolves on
first use. See docs/safetensors.md.

>>> import tensorstream
>>> sd = tensorstream.safetensors.load("s3://bucket/model.safetensors")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from .header import MAX_HEADER_SIZE
    from .iterate import iter_tensors
    from .lazy import SafeOpen, SafeSlice, open
    from .reader import DEFAULT_NUM_READERS, load
    from .writer import save

_WHERE = {
    "DEFAULT_NUM_READERS": "reader",
    "MAX_HEADER_SIZE": "header",
    "SafeOpen": "lazy",
    "SafeSlice": "lazy",
    "iter_tensors": "iterate",
    "load": "reader",
    "open": "lazy",
    "save": "writer",
}

__all__ = [
    "DEFAULT_NUM_READERS",
    "MAX_HEADER_SIZE",
    "SafeOpen",
    "SafeSlice",
    "iter_tensors",
    "load",
    "open",
    "save",
]


__getattr__ = lazy_exports(__name__, _WHERE)
