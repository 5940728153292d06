"""The S3 credential tests' ``sources`` fixture (s3_credential_sources.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3_credential_sources import Sources

from tensorstream.testing.s3_server import MotoS3Server


@pytest.fixture
def sources(isolated_env: Path, monkeypatch: pytest.MonkeyPatch, moto_s3: MotoS3Server) -> Sources:
    """A ``Sources`` over this test's isolated home and moto's server."""
    return Sources(isolated_env / "home", monkeypatch, moto_s3)
