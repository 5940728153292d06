"""Options of the fsspec fallback (light: imports no fsspec filesystem)."""

from __future__ import annotations

__all__ = ["OPTIONS"]

#: ``storage_options`` is passed to ``fsspec.filesystem(protocol, **storage_options)``.
OPTIONS = frozenset({"storage_options"})
