"""Fault settings of the test servers and proxies, and what applying them shares.

:class:`KnownFields` is the base of every fault settings dataclass (the S3 and
HTTP proxies', the TCP proxy's, the HTTP test server's): setting a name that is
no field raises and says what was meant. The proxies also share running a
test's hook with its failures kept (:func:`_run_hook`) and the chunk size that
paces a rate-capped stream (:func:`_chunk_for`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Awaitable
from typing import Any, ClassVar

__all__ = ["KnownFields", "unknown_setting"]

_CHUNK = 64 << 10


class KnownFields:
    """Base of the fault settings dataclasses: setting a name that is not one of
    the class's fields raises :class:`AttributeError` saying what was meant.

    Without it ``faults.raw.wrong_content_rnage = True`` (misspelt) or
    ``tensorstream_s3.faults.raw.use_rst = True`` (a Redis proxy's setting) was
    stored as a new attribute, injected nothing, and the test passed untested."""

    #: The fixture whose ``faults.raw`` this class is (named in the error).
    fixture: ClassVar[str] = ""
    _kinds: ClassVar[list[type[KnownFields]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        KnownFields._kinds.append(cls)

    def __getattr__(self, name: str) -> Any:
        # Only called for a name that is not there: say what was meant.
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(unknown_setting(type(self), name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _settings(type(self)):
            raise AttributeError(unknown_setting(type(self), name))
        super().__setattr__(name, value)


def _settings(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def unknown_setting(cls: type[KnownFields], name: str) -> str:
    """Why ``name`` is no setting of ``cls``: another backend's, or a likely misspelling."""
    fields = _settings(cls)
    owners = sorted(f"{k.fixture} ({k.__name__})" for k in KnownFields._kinds
                    if k is not cls and name in _settings(k))
    where = f"{cls.__name__}" + (f" of {cls.fixture}" if cls.fixture else "")
    if owners:
        return f"{name} is a fault of {', '.join(owners)}, not of {where}"
    close = difflib.get_close_matches(name, fields, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{where} has no setting {name!r}: {hint}its settings are {', '.join(fields)}"


def _reset_fields(obj: Any) -> None:
    for field in dataclasses.fields(obj):
        default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                   else field.default)
        setattr(obj, field.name, default)

async def _run_hook(errors: list[BaseException], call: Awaitable[None]) -> None:
    """Await a test's hook, keeping what it raised in ``errors`` unless it is a
    ``ConnectionError`` (the way a hook cuts a connection on purpose). The proxy's
    loop only logged a failed hook (an assertion in it, a typo) and the client's
    retry hid it: the test passed."""
    try:
        await call
    except ConnectionError:
        raise
    except Exception as exc:
        errors.append(exc)
        raise


def _chunk_for(rate: int | None) -> int:
    # Small writes when rate-capped, so pacing is smooth (about 20 steps a second).
    return _CHUNK if not rate else max(1, min(_CHUNK, rate // 20))
