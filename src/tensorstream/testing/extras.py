"""Packages of tensorstream's ``test`` extra, imported with an error that says how
to get them (``ModuleNotFoundError: No module named 'trustme'`` did not)."""

from __future__ import annotations

from typing import Any

__all__ = ["trustme"]

_HINT = "pip install 'tensorstream[test]'"


def trustme() -> Any:
    """The ``trustme`` module, which makes the TLS test servers' certificates."""
    try:
        import trustme as module
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"a TLS test server (tls=True) needs trustme, from tensorstream's test extra: "
            f"{_HINT}", name="trustme") from exc
    return module
