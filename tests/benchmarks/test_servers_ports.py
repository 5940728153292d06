"""benchmarks.servers: a port picked free and taken by another process before the
server binds it is replaced by another, never mistaken for the server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `benchmarks` lives at the repo root, not in src/
    sys.path.insert(0, str(REPO))

from benchmarks import servers  # noqa: E402

HAVE_NGINX = shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The first two ports handed out are taken at once by a listener that accepts
    and never answers (as another process may, between the pick and the bind)."""
    real, held, ports = servers.free_port, [], []

    def pick() -> int:
        port = real()
        if len(ports) < 2:
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
            ports.append(port)
        return port

    monkeypatch.setattr(servers, "free_port", pick)
    yield ports
    for s in held:
        s.close()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not HAVE_NGINX, reason="needs Debian's nginx")
def test_nginx_on_a_port_taken_first_starts_on_another(tmp_path: Path, taken: list[int]) -> None:
    # The listener answered the readiness probe: the server "started" and its URL was
    # someone else's (and nginx exited after its own bind retries).
    (tmp_path / "root" / "b").mkdir(parents=True)
    (tmp_path / "root" / "b" / "obj").write_bytes(b"served by nginx")
    with servers.start_nginx(tmp_path / "root", tmp_path / "work", workers=1) as srv:
        assert srv.port not in taken and len(taken) == 2
        with urllib.request.urlopen(f"{srv.url}/b/obj", timeout=10) as resp:
            assert resp.read() == b"served by nginx"


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_redis_on_a_port_taken_first_starts_on_another(tmp_path: Path, taken: list[int]) -> None:
    with servers.start_redis(tmp_path / "work") as srv:
        assert srv.port not in taken
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(16).startswith(b"+PONG")


def test_owns_port_tells_the_listener_apart() -> None:
    with socket.socket() as s, subprocess.Popen(["sleep", "30"]) as other:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        try:
            assert servers.owns_port(os.getpid(), port)
            assert not servers.owns_port(other.pid, port)
        finally:
            other.kill()
