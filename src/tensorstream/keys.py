"""Deprecated path: moved to :mod:`tensorstream.copy.keys` (kept for one release)."""

from tensorstream._compat import alias_module

alias_module(__name__, "tensorstream.copy.keys")
