"""Which options of a tensorizer setting hold secrets (shared by ``config`` and ``crypto``,
neither of which imports the other at import time)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..credentials.base import is_secret_name

__all__ = ["holds_secret", "secret_name"]


def secret_name(name: str) -> bool:
    """Whether an option named ``name`` holds a secret (every value under it, for a mapping)."""
    # An access key id is shown, as the AWS CLI shows it (it is no secret alone).
    return is_secret_name(name) and name != "s3_access_key_id"


def holds_secret(name: str, value: Any) -> bool:
    """Whether an option (a ``*_kwargs`` or ``keyfile_options`` entry) is a secret: a
    secret-named value, or an ``encryption`` that is key material (32 key bytes,
    tensorizer's params; an ``Encryption`` naming a key file is not, and shows and
    pickles itself)."""
    if not value:
        return False
    if name == "encryption":
        return getattr(value, "keyfile", None) is None
    if name == "headers":  # every value: HTTP's extra headers are credentials (an API key)
        return True
    if isinstance(value, Mapping):  # fsspec's storage_options={"password": ...}
        return secret_name(name) or any(holds_secret(str(k), v) for k, v in value.items())
    return secret_name(name)
