"""Shared credential types: a value that remembers where it came from."""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

__all__ = ["SECRET_WORDS", "Sourced", "is_secret_name", "mask"]

T = TypeVar("T")

#: Words that make an option or field name hold a secret, wherever it is (``s3_secret_access_key``,
#: ``redis_password``, ``token``, ``api_key``, ``credentials``, ``auth``, ``passphrase``...).
#: The one list: describe_credentials and the tensorizer settings both classify by it.
SECRET_WORDS = ("secret", "password", "passphrase", "token", "key", "credential", "auth")


def is_secret_name(name: str) -> bool:
    """Whether a value named ``name`` is a secret, by :data:`SECRET_WORDS` (any case)."""
    lowered = name.lower()
    return any(w in lowered for w in SECRET_WORDS)


def mask(secret: str | None) -> str:
    """``'***'`` for any non-empty secret; never reveals length or characters."""
    return "***" if secret else "<unset>"


@dataclasses.dataclass(frozen=True)
class Sourced(Generic[T]):
    """A credential/config value tagged with its source, e.g. ``"env AWS_REGION"``.

    ``secret=True`` values are masked in ``repr``/``str``, never pickled, and
    masked in third-party log records and error chains (``register_secret``).
    """

    value: T
    source: str
    secret: bool = False

    def __post_init__(self) -> None:
        if self.secret and isinstance(self.value, str):
            from .._log_redaction import register_secret

            register_secret(self.value)  # masked wherever a library logs or echoes it

    def __repr__(self) -> str:
        shown = mask(str(self.value)) if self.secret else repr(self.value)
        return f"Sourced({shown}, from {self.source})"

    __str__ = __repr__

    def __reduce__(self):  # type: ignore[no-untyped-def]
        if self.secret:
            raise TypeError("refusing to pickle a secret credential value")
        return (Sourced, (self.value, self.source, self.secret))
