"""Fixtures of the tensorizer tests: one ``TensorBackend`` per storage service
(``tensorizer_models.make_backend``) and one producer per writer of tensorizer files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tensorizer_models import PRODUCERS, TensorBackend, make_backend


@pytest.fixture(params=["local", "http", "s3", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> TensorBackend:
    return make_backend(request.param, request, tmp_path)


@pytest.fixture(params=sorted(PRODUCERS))
def producer(request: pytest.FixtureRequest) -> Callable[..., bytes]:
    return PRODUCERS[request.param]
