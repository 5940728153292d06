"""The bounds a Redis object's manifest may claim (``layout.MAX_CHUNKS`` chunks,
``layout.MAX_OBJECT_SIZE`` bytes) hold for writes too: before, a writer with
small chunks staged and published more chunks than readers take, and every
read of the object then failed ("manifest claims ..."). A real redis-server;
the chunk limit is lowered (2**24 chunks of 1 KiB would be 16 GiB)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tensorstream
from tensorstream.copy import copy
from tensorstream.errors import ConfigurationError, UnsupportedOperationError
from tensorstream.providers.redis import layout
from tensorstream.testing.redis_server import RedisServer

CS = 1 << 10  # the smallest redis_chunk_size


def _keys(srv: RedisServer, key: str) -> list[bytes]:
    with srv.client() as c:
        return sorted(k for k in c.keys("*") if k == key.encode() or k.startswith(key.encode() + b":"))


@pytest.fixture
def four_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "MAX_CHUNKS", 4)


@pytest.mark.usefixtures("four_chunks")
def test_a_stream_of_more_chunks_than_readers_take_is_refused(redis_server: RedisServer) -> None:
    fits = os.urandom(4 * CS)
    with tensorstream.open(redis_server.url("lim/fits"), "wb", redis_chunk_size=CS) as f:
        f.write(fits)
    with tensorstream.open(redis_server.url("lim/fits")) as f:
        assert f.read() == fits

    with pytest.raises(ConfigurationError, match="more than 4 chunks") as info, \
            tensorstream.open(redis_server.url("lim/over"), "wb", redis_chunk_size=CS) as f:
        f.write(fits + b"x")
    assert "redis_chunk_size of at least 1025" in str(info.value)
    assert _keys(redis_server, "lim/over") == []  # nothing published, nothing staged left


@pytest.mark.usefixtures("four_chunks")
def test_cp_refuses_before_anything_is_staged(redis_server: RedisServer, tmp_path: Path) -> None:
    src = tmp_path / "m"
    src.write_bytes(os.urandom(5 * CS))
    result = copy(str(src), redis_server.url("lim/cp"), redis_chunk_size=CS)
    assert not result.ok and "more than 4 chunks" in result.errors[0], result.errors
    assert _keys(redis_server, "lim/cp") == []
    # ... and the advice works
    result = copy(str(src), redis_server.url("lim/cp"), redis_chunk_size=2 * CS)
    assert result.ok, result.errors
    with tensorstream.open(redis_server.url("lim/cp")) as f:
        assert f.read() == src.read_bytes()


def test_an_object_past_the_size_bound_is_refused_up_front(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(layout, "MAX_OBJECT_SIZE", 3 * CS)
    src = tmp_path / "m"
    src.write_bytes(os.urandom(3 * CS + 1))
    result = copy(str(src), redis_server.url("lim/size"), redis_chunk_size=CS)
    assert not result.ok and "split it into several objects" in result.errors[0], result.errors
    with pytest.raises(UnsupportedOperationError), \
            tensorstream.open(redis_server.url("lim/size"), "wb", redis_chunk_size=CS) as f:
        f.write(src.read_bytes())
    assert _keys(redis_server, "lim/size") == []
