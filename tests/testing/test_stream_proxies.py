"""The start/stop plumbing ``TCPFaultProxy`` and ``ForwardProxy`` share
(``tensorstream.testing.loop_thread._StreamServer``), on real sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from tensorstream.testing.forward_proxy import ForwardProxy
from tensorstream.testing.proxy import TCPFaultProxy


@pytest.fixture
def upstream() -> Iterator[ForwardProxy]:
    with ForwardProxy() as server:
        yield server


MAKERS: dict[str, Callable[[ForwardProxy], ForwardProxy | TCPFaultProxy]] = {
    "forward": lambda _up: ForwardProxy(),
    "tcp": lambda up: TCPFaultProxy("127.0.0.1", up.port),
}


def _accepted(proxy: ForwardProxy | TCPFaultProxy) -> int:
    return proxy.connections if isinstance(proxy, ForwardProxy) else proxy.faults.connections


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_start_is_idempotent_and_stop_cuts_every_connection(upstream: ForwardProxy,
                                                            kind: str) -> None:
    proxy = MAKERS[kind](upstream)
    assert proxy.start() is proxy
    port = proxy.port
    assert port and proxy.start() is proxy and proxy.port == port
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        # a CONNECT to nowhere listening is answered (502) through either proxy: served
        client.sendall(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        assert client.recv(64).startswith(b"HTTP/1.1 502")
        held = socket.create_connection(("127.0.0.1", port), timeout=10)
        deadline = time.monotonic() + 10
        while _accepted(proxy) < 2 and time.monotonic() < deadline:  # being served
            time.sleep(0.01)
        proxy.stop()
        try:
            assert held.recv(64) == b""  # cut (FIN or reset)
        except ConnectionResetError:
            pass
        held.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
        proxy.stop()  # again: nothing to do
    finally:
        client.close()
        proxy.stop()


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_with_starts_and_stops(upstream: ForwardProxy, kind: str) -> None:
    with MAKERS[kind](upstream) as proxy:
        port = proxy.port
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        assert repr(proxy).startswith(f"{type(proxy).__name__}(127.0.0.1:{port}")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_client_that_connected_just_before_stop_is_cut_too(upstream: ForwardProxy,
                                                             kind: str) -> None:
    # Accepted, its serving task not started yet when stop() came: the task was
    # cancelled before it could register the connection, which stayed open, and
    # the client waited for its own timeout (37 of 40 tries).
    for _ in range(20):
        proxy = MAKERS[kind](upstream).start()
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        try:
            proxy.stop()
            try:
                assert client.recv(64) == b""
            except ConnectionResetError:
                pass
        finally:
            client.close()
            proxy.stop()
