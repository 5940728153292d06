"""Fixtures for the redis backend (session-scoped servers on loopback).

Every server is Debian's ``redis-server`` started by
:mod:`tensorstream.testing.redis_server`; the tests skip only when it is not
installed (CI installs it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorstream.testing.redis_server import RedisCluster, RedisServer, redis_available

REDIS_PASSWORD = "default-pw-Zq81"
ACL_USER, ACL_PASSWORD = "loader", "acl-pw-Xk27"


def _require_redis() -> None:
    if not redis_available():
        pytest.skip("redis-server/redis-cli not installed (apt-get install redis-server)")


@pytest.fixture(scope="session")
def redis_tmp(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the servers' files go: pytest's base temp, which it prunes, so a killed
    run leaves nothing in the system's temp dir for good."""
    return str(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="session")
def redis_server(redis_tmp: str) -> Iterator[RedisServer]:
    """A plain server, no password."""
    _require_redis()
    with RedisServer(tmp_dir=redis_tmp) as srv:
        yield srv


@pytest.fixture(scope="session")
def redis_auth_server(redis_tmp: str) -> Iterator[RedisServer]:
    """``requirepass`` on the default user plus an ACL user."""
    _require_redis()
    with RedisServer(password=REDIS_PASSWORD, acl_users={ACL_USER: ACL_PASSWORD},
                     tmp_dir=redis_tmp) as srv:
        yield srv


@pytest.fixture(scope="session")
def redis_tls_server(redis_tmp: str) -> Iterator[RedisServer]:
    """TLS only (trustme CA in ``ca_file``); client certificates optional."""
    _require_redis()
    with RedisServer(tls=True, tls_auth_clients="optional", tmp_dir=redis_tmp) as srv:
        yield srv


@pytest.fixture(scope="session")
def redis_mtls_server(redis_tmp: str) -> Iterator[RedisServer]:
    """TLS that requires a client certificate signed by the test CA."""
    _require_redis()
    with RedisServer(tls=True, tls_auth_clients="yes", tmp_dir=redis_tmp) as srv:
        yield srv


@pytest.fixture(scope="session")
def redis_cluster(redis_tmp: str) -> Iterator[RedisCluster]:
    """A real 3-primary Redis Cluster."""
    _require_redis()
    with RedisCluster(3, tmp_dir=redis_tmp) as cluster:
        yield cluster
