"""Deprecated path: moved to :mod:`tensorstream.layers.stack` (kept for one release)."""

from tensorstream._compat import alias_module

alias_module(__name__, "tensorstream.layers.stack")
