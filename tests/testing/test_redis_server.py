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


class _Taker:
    """Takes the ports ``free_port`` hands out first (as another process may, between
    the pick and redis-server's bind): a real listener, or a real other redis-server."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, first: int) -> None:
        from tensorstream.testing import redis_server

        self.real = redis_server.free_port
        self.taken: list[int] = []
        self.first = first
        self.sockets: list[socket.socket] = []
        monkeypatch.setattr(redis_server, "free_port", self.pick)

    def pick(self) -> int:
        port = self.real()
        if len(self.taken) < self.first:
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            self.sockets.append(s)
            self.taken.append(port)
        return port

    def close(self) -> None:
        for s in self.sockets:
            s.close()


@pytest.mark.parametrize("kind", [RedisServer, RedisCluster])
def test_a_port_taken_before_the_bind_is_replaced_by_another(
        kind: type, monkeypatch: pytest.MonkeyPatch) -> None:
    # The port was picked free, then redis-server started on it: taken meanwhile,
    # the server exited ("Address already in use") and the fixture failed.
    taker = _Taker(monkeypatch, first=2)
    try:
        with kind() as server:
            with server.client() as client:
                client.set("k", b"v")
                assert client.get("k") == b"v"
            assert server.port not in taker.taken
    finally:
        taker.close()


def test_a_port_taken_by_another_redis_server_is_not_mistaken_for_ours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Another redis-server that answers PING on the port is not this one.
    from tensorstream.testing import redis_server

    with RedisServer() as other:
        real, handed = redis_server.free_port, []

        def pick() -> int:
            handed.append(other.port if not handed else real())
            return handed[-1]

        monkeypatch.setattr(redis_server, "free_port", pick)
        with RedisServer(password="pw-1") as mine:
            assert mine.port != other.port and len(handed) >= 2
            with mine.client() as client:
                assert client.ping()


def test_a_port_taken_every_time_gives_up_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    taker = _Taker(monkeypatch, first=100)
    try:
        with pytest.raises(RuntimeError, match="no free port in 5 tries"):
            RedisServer().start()
        assert len(taker.taken) == 5
    finally:
        taker.close()


@pytest.mark.parametrize("key", ["0", "12", "0/7", "k1"])
def test_url_of_a_key_of_digits_names_that_key(key: str) -> None:
    # url("0") was redis://host:port/0, which tensorstream refuses (redis-py reads the
    # database number there): a test author's URI for the key "0" failed to parse.
    import tensorstream

    with RedisServer() as server:
        uri = server.url(key)
        with tensorstream.open(uri, "wb") as f:
            f.write(b"digits")
        with tensorstream.open(uri) as f:
            assert f.read() == b"digits"
        assert tensorstream.parse_uri(uri).path == key
    assert tensorstream.parse_uri(server.url("7/")).path == "7/"  # a folder of digits too


@pytest.mark.parametrize("kind", [RedisServer, RedisCluster])
def test_files_go_under_tmp_dir(kind: type, tmp_path) -> None:
    # RedisCluster took no tmp_dir: its nodes' files went to the system's temp dir,
    # where a killed run left them for good (pytest prunes its own base temps).
    with kind(tmp_dir=tmp_path) as server:
        workdir = server._dir
        assert workdir is not None and os.path.dirname(workdir) == str(tmp_path)
        assert os.listdir(workdir)  # the nodes' (or the server's) files are there
    assert not os.path.exists(workdir) and tmp_path.is_dir()


def test_the_tests_servers_and_cluster_keep_their_files_in_pytests_base_temp(
        redis_server, redis_cluster, tmp_path_factory) -> None:
    base = str(tmp_path_factory.getbasetemp())
    for server in (redis_server, redis_cluster):
        assert server._dir is not None and server._dir.startswith(base + os.sep), server._dir
