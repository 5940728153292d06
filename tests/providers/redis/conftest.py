"""Fixtures of the Redis provider's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorstream.testing.redis_server import RedisServer, redis_available


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A server of its own: CLIENT PAUSE would stall every other test on a shared one."""
    if not redis_available():
        pytest.skip("redis-server not installed")
    with RedisServer() as srv:
        yield srv
