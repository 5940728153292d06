"""Shared fixtures. Backend fixtures live in one module per backend
(``fixtures_<backend>.py`` beside this file), loaded here."""

from __future__ import annotations

pytest_plugins = [
    "fixtures_common",
    "fixtures_http",
    "fixtures_s3",
    "fixtures_redis",
]


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """Collect garbage once the session's servers are stopped: coroutines of a
    stopped aiohttp server left to a later collection can be finalized inside a
    later import's AST build (hypothesis's summary imports it at the end), where
    CPython 3.11 formats their warning's traceback with ``ast.parse`` and the
    nested build raises ``SystemError: AST constructor recursion depth mismatch``."""
    import gc

    gc.collect()
