"""The copy tests' ``flaky`` fixture: the ``flakytest://`` provider (flaky_providers.py),
emptied and mended again after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flaky_providers import FlakyProvider


@pytest.fixture
def flaky() -> Iterator[type[FlakyProvider]]:
    """``FlakyProvider``, whose objects and failures this test sets."""
    yield FlakyProvider
    FlakyProvider.store.clear()
    FlakyProvider.fail_from = None
    FlakyProvider.fail_only = set()
