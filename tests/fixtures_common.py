"""Fixtures shared by every backend's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """The suite talks to servers on loopback only, and tensorstream now honours
    HTTPS_PROXY & co.: a proxy set on a developer's or CI runner's machine would
    carry (and break) those requests, in this process and the CLI's children."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            del os.environ[name]


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Environment with no real credentials/endpoints: AWS/S3/Redis/HTTP and proxy
    variables removed, config files pointed at empty files, instance metadata disabled."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "S3_", "REDIS_", "REDISCLI_", "TENSORSTREAM_")) or name in (
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "NETRC",
        ) or name.lower().endswith("_proxy"):  # a CI runner's proxy: tests stay on loopback
            monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "empty-config"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    yield tmp_path
