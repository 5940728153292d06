"""Deprecated path: moved to :mod:`tensorstream.providers.s3.config` (kept for one release)."""

from tensorstream._compat import alias_module

alias_module(__name__, "tensorstream.providers.s3.config")
