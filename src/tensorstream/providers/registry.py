"""Scheme -> provider registry.

Built-in providers are imported lazily (a missing optional dependency only
matters when its scheme is used). Third parties register through the
``tensorstream.providers`` entry-point group, or by calling :func:`register`.
Registering over an existing scheme requires ``replace=True``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from ..errors import UnknownSchemeError
from .base import Provider

__all__ = [
    "ENTRY_POINT_GROUP",
    "Service",
    "credential_describer",
    "known_option_names",
    "register",
    "registered_schemes",
    "resolve_provider_class",
]

ENTRY_POINT_GROUP = "tensorstream.providers"


@dataclasses.dataclass(frozen=True)
class Service:
    """A built-in service: its provider class and its light config module, both imported lazily.

    The config module defines ``OPTIONS`` (the option names the service accepts) and
    ``describe_credentials(parsed, options)``; it imports no client library.
    """

    provider: str
    config: str | None = None


# The one table of built-in schemes: one line per scheme.
_BUILTIN: dict[str, Service] = {
    "file": Service("tensorstream.providers.local:LocalProvider"),
    "http": Service("tensorstream.providers.http:HTTPProvider", "tensorstream.providers.http.config"),
    "https": Service("tensorstream.providers.http:HTTPProvider", "tensorstream.providers.http.config"),
    "s3": Service("tensorstream.providers.s3:S3Provider", "tensorstream.providers.s3.config"),
    "redis": Service("tensorstream.providers.redis:RedisProvider", "tensorstream.providers.redis.config"),
    "rediss": Service("tensorstream.providers.redis:RedisProvider", "tensorstream.providers.redis.config"),
}
_FSSPEC_FALLBACK = Service("tensorstream.providers.fsspec:FsspecProvider",
                           "tensorstream.providers.fsspec.config")

_registry: dict[str, type[Provider] | str] = {k: v.provider for k, v in _BUILTIN.items()}
_entry_points_loaded = False
_replaced: set[str] = set()  # built-in schemes a caller registered over


def register(scheme: str, provider: type[Provider] | str, *, replace: bool = False) -> None:
    """Register ``provider`` (a class or ``"module:Class"``) for ``scheme``."""
    scheme = scheme.lower()
    if scheme in _registry and not replace and _registry[scheme] != provider:
        raise ValueError(
            f"scheme {scheme!r} is already registered to {_registry[scheme]!r}; pass replace=True"
        )
    if scheme in _BUILTIN and provider != _BUILTIN[scheme].provider:
        _replaced.add(scheme)
    _registry[scheme] = provider


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    # Scanning installed distributions costs tens of milliseconds: only done
    # for a scheme that is not registered already (entry points never replace one).
    from importlib.metadata import entry_points

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
    scheme = scheme.lower()
    entry = _registry.get(scheme)
    if entry is None:
        _load_entry_points()
        entry = _registry.get(scheme)
    if entry is None:
        if _fsspec_knows(scheme):
            return _import(_FSSPEC_FALLBACK.provider)
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


def _config_module(scheme: str) -> Any:
    service = _BUILTIN.get(scheme)
    if service is None or service.config is None or scheme in _replaced:
        return None
    return importlib.import_module(service.config)


def known_option_names() -> frozenset[str]:
    """Every option name a built-in service or an already loaded provider accepts.

    Built-ins are read from their light config modules, so no client library is imported.
    """
    names: set[str] = set()
    for service in (*_BUILTIN.values(), _FSSPEC_FALLBACK):
        if service.config is not None:
            names |= importlib.import_module(service.config).OPTIONS
    for entry in _registry.values():
        if isinstance(entry, type):
            names |= entry.option_names
    return frozenset(names)


def credential_describer(scheme: str) -> Callable[[Any, dict[str, Any]], Any] | None:
    """The function describing ``scheme``'s credentials, or ``None`` (generic report);
    :class:`UnknownSchemeError` when no provider serves ``scheme``.

    Built-ins: ``describe_credentials`` of the service's config module. Third-party providers:
    their ``describe_credentials`` classmethod, when they define one.
    """
    scheme = scheme.lower()
    module = _config_module(scheme)
    if module is not None:
        return module.describe_credentials  # type: ignore[no-any-return]
    try:
        cls = resolve_provider_class(scheme)  # a scheme nothing serves: UnknownSchemeError
    except ImportError:
        return None
    return getattr(cls, "describe_credentials", None)
