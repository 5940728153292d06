"""tensorstream.testing.redis_server's servers on their own: their life cycle."""

from __future__ import annotations

import os
import socket

import pytest

from tensorstream.testing.redis_server import RedisCluster, RedisServer, redis_available

pytestmark = pytest.mark.skipif(not redis_available(),
                                reason="redis-server/redis-cli not installed (apt-get install redis-server)")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("kind", [RedisServer, RedisCluster])
def test_start_twice_keeps_one_server(kind):
    # start() on a running server (e.g. inside its own with-block) started a second
    # one over it: the first, its port and its temporary directory were no longer
    # known to stop(), so they outlived the with-block (the server until the
    # process ended, the directory for good). It is idempotent, as the other
    # test servers' start() is.
    with kind() as server:
        port, workdir = server.port, server._dir
        assert server.start() is server
        assert (server.port, server._dir) == (port, workdir)
        with server.client() as client:
            client.set("k", b"v")
    assert not _listening(port)
    assert workdir is not None and not os.path.exists(workdir)


def test_a_cluster_that_cannot_form_says_why_and_leaves_nothing():
    # redis-cli's reason went to a pipe nobody read: "returned non-zero exit status 1".
    cluster = RedisCluster(nodes=1)
    with pytest.raises(RuntimeError, match=r"redis-cli --cluster create exited 1:\n\S"):
        cluster.start()
    assert cluster.ports and not _listening(cluster.ports[0])
