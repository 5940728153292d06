"""A Redis server with few free connections (``maxclients``): ``cp`` to and from
it uses what the server allows, and says so clearly when it allows none.

Each test starts its own ``redis-server`` (the limit is the server's), holds
some connections open with plain clients, and runs the CLI in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from tensorstream.testing.redis_server import RedisServer, redis_available

pytestmark = pytest.mark.skipif(not redis_available(), reason="needs redis-server")

DATA = os.urandom(24 << 20)  # six chunks of the default 4 MiB


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


class Crowd:
    """Other clients holding all but ``free`` of the server's connections."""

    def __init__(self, srv: RedisServer, free: int) -> None:
        self.admin = srv.client()
        self.admin.ping()
        self.held = [srv.client() for _ in range(3)]
        for c in self.held:
            c.ping()
        connected = len(self.admin.client_list())
        self.admin.config_set("maxclients", connected + free)

    def close(self) -> None:
        self.admin.config_set("maxclients", 10000)
        for c in [*self.held, self.admin]:
            c.close()


def cp(src: str, dst: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", "cp", src, dst],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("free", [1, 3])
def test_cp_into_redis_uses_the_connections_the_server_has_free(
        server: RedisServer, tmp_path: Path, free: int) -> None:
    # The write opened up to ~16 connections at once and failed with "max number of
    # clients reached" where loads of the same object worked.
    src = tmp_path / "m.bin"
    src.write_bytes(DATA)
    crowd = Crowd(server, free)
    try:
        done = cp(str(src), server.url("m.bin"))
    finally:
        crowd.close()
    assert done.returncode == 0, done.stderr
    with tensorstream.open(server.url("m.bin")) as f:
        assert f.read() == DATA


@pytest.mark.parametrize("free", [1, 3])
def test_cp_out_of_redis_uses_the_connections_the_server_has_free(
        server: RedisServer, tmp_path: Path, free: int) -> None:
    with tensorstream.open(server.url("m.bin"), "wb") as w:
        w.write(DATA)
    crowd = Crowd(server, free)
    try:
        done = cp(server.url("m.bin"), str(tmp_path / "out.bin"))
    finally:
        crowd.close()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.bin").read_bytes() == DATA


@pytest.mark.parametrize("free", [1, 2])
def test_a_read_and_a_streamed_write_with_few_free_connections_work(
        server: RedisServer, free: int) -> None:
    crowd = Crowd(server, free)
    try:
        with tensorstream.open(server.url("m.bin"), "wb", redis_chunk_size=1 << 20) as w:
            for at in range(0, len(DATA), 3 << 20):  # many chunks in flight
                w.write(DATA[at : at + (3 << 20)])
        with tensorstream.open(server.url("m.bin"), concurrency=8) as f:
            assert f.read() == DATA
    finally:
        crowd.close()


@pytest.mark.parametrize("direction", ["into", "out of"])
def test_no_free_connection_at_all_is_a_clear_error(
        server: RedisServer, tmp_path: Path, direction: str) -> None:
    src = tmp_path / "m.bin"
    src.write_bytes(DATA[: 1 << 20])
    server.put("m.bin", DATA[: 1 << 20])
    crowd = Crowd(server, 0)
    try:
        start = time.monotonic()
        if direction == "into":
            done = cp(str(src), server.url("new.bin"))
        else:
            done = cp(server.url("m.bin"), str(tmp_path / "out.bin"))
        took = time.monotonic() - start
    finally:
        crowd.close()
    assert done.returncode != 0
    assert "max number of clients reached" in done.stderr, done.stderr
    assert "refused every connection" in done.stderr and "raise maxclients" in done.stderr
    assert "Traceback" not in done.stderr
    assert took < 60
    assert not (tmp_path / "out.bin").exists()
    assert server.get("new.bin") is None


def test_a_narrowed_width_grows_again_after_interactions_that_went_well() -> None:
    # Narrowed once for good, a long-lived provider (a model server) kept one
    # connection after a moment the server was full.
    from tensorstream.providers.redis.width import _GROW_AFTER, NARROWED, Width

    width = Width()
    with width.slot_blocking(), width.slot_blocking(), width.slot_blocking():
        assert width.refused(idle_dropped=False) == NARROWED
    assert width.limit == 2
    for _ in range(_GROW_AFTER):
        width.went_well()
    assert width.limit == 3
