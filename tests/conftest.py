"""Shared fixtures. Backend fixtures live in one module per backend
(``fixtures_<backend>.py`` beside this file), loaded here."""

from __future__ import annotations

pytest_plugins = [
    "fixtures_common",
    "fixtures_http",
    "fixtures_s3",
    "fixtures_redis",
]
