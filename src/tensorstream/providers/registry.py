"""Scheme -> provider registry.

Built-in providers are imported lazily (a missing optional dependency only
matters when its scheme is used). Third parties register through the
``tensorstream.providers`` entry-point group, or by calling :func:`register`.
Registering over an existing scheme requires ``replace=True``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from ..errors import UnknownSchemeError
from .base import Provider

__all__ = ["ENTRY_POINT_GROUP", "register", "registered_schemes", "resolve_provider_class"]

ENTRY_POINT_GROUP = "tensorstream.providers"

# scheme -> "module:Class" (lazy) -- one line per built-in backend.
_BUILTIN: dict[str, str] = {
    "file": "tensorstream.providers.local.provider:LocalProvider",
    "http": "tensorstream.providers.http.provider:HTTPProvider",
    "https": "tensorstream.providers.http.provider:HTTPProvider",
    "s3": "tensorstream.providers.s3.provider:S3Provider",
    "redis": "tensorstream.providers.redis.provider:RedisProvider",
    "rediss": "tensorstream.providers.redis.provider:RedisProvider",
}
_FSSPEC_FALLBACK = "tensorstream.providers.fsspec.provider:FsspecProvider"

_registry: dict[str, type[Provider] | str] = dict(_BUILTIN)
_entry_points_loaded = False


def register(scheme: str, provider: type[Provider] | str, *, replace: bool = False) -> None:
    """Register ``provider`` (a class or ``"module:Class"``) for ``scheme``."""
    scheme = scheme.lower()
    if scheme in _registry and not replace and _registry[scheme] != provider:
        raise ValueError(
            f"scheme {scheme!r} is already registered to {_registry[scheme]!r}; pass replace=True"
        )
    _registry[scheme] = provider


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() not in _registry:
            _registry[ep.name.lower()] = ep.value


def registered_schemes() -> list[str]:
    """All schemes with a provider, sorted."""
    _load_entry_points()
    return sorted(_registry)


def _import(target: str) -> type[Provider]:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise TypeError(f"{target} is not a tensorstream Provider subclass")
    return cls


def resolve_provider_class(scheme: str) -> type[Provider]:
    """The provider class for ``scheme``; fsspec protocols fall back to the adapter."""
    _load_entry_points()
    scheme = scheme.lower()
    entry = _registry.get(scheme)
    if entry is None:
        if _fsspec_knows(scheme):
            return _import(_FSSPEC_FALLBACK)
        raise UnknownSchemeError(
            f"no provider for scheme {scheme!r}; registered: {', '.join(registered_schemes())} "
            "(plus any protocol fsspec knows)"
        )
    if isinstance(entry, str):
        cls = _import(entry)
        _registry[scheme] = cls
        return cls
    return entry


def _fsspec_knows(scheme: str) -> bool:
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:  # pragma: no cover - fsspec is a hard dependency
        return False
    return scheme in known_implementations or scheme in registry


def all_option_names() -> frozenset[str]:
    """Every option name any registered built-in provider understands."""
    names: set[str] = set()
    for scheme in list(_registry):
        try:
            names |= resolve_provider_class(scheme).option_names
        except ImportError:
            continue
    return frozenset(names)


def _unused(_: Any) -> None:  # pragma: no cover
    pass
