"""Deprecated path: moved to :mod:`tensorstream.tensorizer` (kept for one release)."""

from tensorstream._compat import alias_module

alias_module(__name__, "tensorstream.tensorizer")
