"""Scheme -> provider registry.

Built-in providers are imported lazily (a missing optional dependency only
matters when its scheme is used). Third parties register through the
``tensorstream.providers`` entry-point group, or by calling :func:`register`.
Registering over an existing scheme requires ``replace=True``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigurationError, UnknownSchemeError
from .base import Provider

__all__ = [
    "ENTRY_POINT_GROUP",
    "Service",
    "credential_describer",
    "known_option_names",
    "unknown_option_names",
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
_ambiguous: dict[str, list[str]] = {}  # schemes two installed entry points claim


#: RFC 3986's scheme: what parse_uri can ever hand to a provider ("s3://" or "" never is).
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")  # (fullmatch: '$' would pass a final "\n")
#: ``"package.module:Class"``, the form of an entry point's value.
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _registered() -> str:
    return ", ".join(registered_schemes())


def _check_class(cls: Any, what: str) -> type[Provider]:
    """``cls`` if it is a concrete Provider subclass, else a TypeError naming what is wrong:
    an abstract one was accepted and its inherited empty ``from_uri`` returned None, which
    failed at the first open as "'NoneType' object has no attribute 'service'"."""
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise TypeError(f"{what} is not a tensorstream Provider subclass "
                        f"(got {cls!r}); registered: {_registered()}")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TypeError(f"{what} does not implement the required method(s) "
                        f"{', '.join(missing)}; registered: {_registered()}")
    return cls


def register(scheme: str, provider: type[Provider] | str, *, replace: bool = False) -> None:
    """Register ``provider`` (a class or ``"module:Class"``) for ``scheme``.

    The scheme and the class are checked here (a string target when first used);
    a :class:`ConfigurationError` or ``TypeError`` names the problem and the
    schemes registered."""
    if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme.lower()):
        raise ConfigurationError(
            f"scheme must be a URI scheme such as 'myfs' (a letter, then letters, digits, "
            f"'+', '-' or '.'; no '://'), got {scheme!r}; registered: {_registered()}")
    scheme = scheme.lower()
    if isinstance(provider, str):
        if not _TARGET.fullmatch(provider):
            raise ConfigurationError(
                f"provider for {scheme!r} must be a Provider subclass or a 'module:Class' "
                f"string, got {provider!r}")
    else:
        _check_class(provider, f"provider for {scheme!r}")
    if scheme in _registry and not replace and _registry[scheme] != provider:
        raise ConfigurationError(
            f"scheme {scheme!r} is already registered to {_registry[scheme]!r}; pass "
            f"replace=True to replace it (registered: {_registered()})"
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

    offered: dict[str, set[str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        offered.setdefault(ep.name.lower(), set()).add(ep.value)
    for name, values in offered.items():
        if name in _registry:
            continue
        if len(values) > 1:
            # two installed packages claim the scheme: which one served it depended on
            # the order of sys.path; refused when the scheme is used
            _ambiguous[name] = sorted(values)
        else:
            _registry[name] = values.pop()


def _did_you_mean(scheme: str, known: list[str]) -> str:
    """`` (did you mean 's3://'?)`` for a near miss of a registered scheme (``s4``, ``htps``,
    ``redsi``), else nothing: a first URI's typo should name its fix, not only the list."""
    close = difflib.get_close_matches(scheme, known, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}://'?)" if close else ""


def registered_schemes() -> list[str]:
    """All schemes with a provider, sorted."""
    _load_entry_points()
    return sorted(_registry)


def _import(target: str, scheme: str | None = None) -> type[Provider]:
    module_name, colon, attr = target.partition(":")
    builtin = scheme is None or (scheme in _BUILTIN and scheme not in _replaced)
    what = f"provider {target!r} for scheme {scheme!r}"
    if not builtin and not (colon and _TARGET.fullmatch(target)):
        # an entry point's value without ':Class' looked up the attribute '' of the module
        raise ConfigurationError(f"{what} is not a 'module:Class' target; "
                                 f"registered: {_registered()}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if builtin:  # a missing optional dependency: its own message says what to install
            raise
        raise ImportError(f"{what} failed to import ({type(exc).__name__}: {exc}); "
                          f"registered: {_registered()}", name=exc.name) from exc
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"{what}: module {module_name!r} has no {attr!r}; "
                                 f"registered: {_registered()}") from None
    return _check_class(cls, what)


def resolve_provider_class(scheme: str) -> type[Provider]:
    """The provider class for ``scheme``; fsspec protocols fall back to the adapter."""
    scheme = scheme.lower()
    entry = _registry.get(scheme)
    if entry is None:
        _load_entry_points()
        entry = _registry.get(scheme)
    if entry is None and scheme in _ambiguous:
        raise ConfigurationError(
            f"scheme {scheme!r} is claimed by more than one installed '{ENTRY_POINT_GROUP}' "
            f"entry point ({', '.join(_ambiguous[scheme])}); uninstall one, or choose with "
            f"tensorstream.register({scheme!r}, 'module:Class', replace=True) "
            f"(registered: {_registered()})")
    if entry is None:
        if _fsspec_knows(scheme):
            return _import(_FSSPEC_FALLBACK.provider)
        known = registered_schemes()
        raise UnknownSchemeError(
            f"no provider for scheme {scheme!r}{_did_you_mean(scheme, known)}; registered: "
            f"{', '.join(known)} (plus any protocol fsspec knows)"
        )
    if isinstance(entry, str):
        cls = _import(entry, scheme)
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


def unknown_option_names(names: Iterable[str]) -> set[str]:
    """Those of ``names`` that no service accepts (:func:`known_option_names`), looking
    first where it costs nothing (loaded providers, config modules already imported),
    then in the config module of the service a name is prefixed with (``s3_``,
    ``redis_``): one options dict serves both sides of a ``cp``. The other config
    modules, then the registered third-party providers not imported yet, are imported
    only while a name is still unaccounted for."""
    left = set(names)
    for entry in _registry.values():
        if isinstance(entry, type):
            left -= entry.option_names
    configs = [s.config for s in (*_BUILTIN.values(), _FSSPEC_FALLBACK) if s.config is not None]

    def cost(config: str) -> tuple[bool, bool]:  # imported already; a service's own prefix
        service = config.rsplit(".", 2)[-2]  # tensorstream.providers.<service>.config
        return config not in sys.modules, not any(n.startswith(f"{service}_") for n in left)

    for config in sorted(dict.fromkeys(configs), key=cost):
        if not left:
            break
        left -= importlib.import_module(config).OPTIONS
    if left:  # third-party providers name their options on the class: import those left
        _load_entry_points()
        for scheme, entry in list(_registry.items()):
            if not left:
                break
            if isinstance(entry, str) and (scheme not in _BUILTIN or scheme in _replaced):
                try:
                    left -= resolve_provider_class(scheme).option_names
                except Exception:  # (a broken one says so when its scheme is used)
                    continue
    return left


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
