"""The conversion tests' ``store`` fixture: each test that takes it runs on local disk, S3 and
Redis (``make_store`` in tests/stores.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stores import Store, make_store


@pytest.fixture(params=["local", "s3", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh store of each kind, under a prefix of its own."""
    return make_store(request.param, request, tmp_path / "store")
