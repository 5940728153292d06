"""Reliability: numbers in a Redis manifest are not trusted (issue 15, class 5).

A manifest is a hash anyone with access to the Redis can write. One that claims 10**15
bytes (or 2**30 chunks) must be found corrupt *before* anything is deleted: ``rm`` used to
drop the manifest first and then build a list of every chunk name until memory ran out,
leaving the chunks behind. Now it is removed as a damaged object: its manifest and the keys
named as its chunks that exist, never a list built from its numbers. The CLI runs in a
child process with a 1.5 GiB address-space limit, so a regression fails the test instead
of exhausting the machine."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

import tensorstream
from reliability_helpers import unique
from tensorstream import _loop, errors
from tensorstream.testing.redis_server import RedisServer

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(120)]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *args], capture_output=True,
                          text=True, timeout=90, preexec_fn=_limit_memory)


def _forge(server: RedisServer, key: str, *, size: int, chunk_size: int) -> list[str]:
    """A manifest claiming ``size`` bytes, with its first three chunks really there."""
    gen = "g" + unique("")[-8:]
    chunks = [f"{key}:{gen}:{i * chunk_size}" for i in range(3)]
    with server.client() as c:
        c.hset(key, mapping={"tensorstream": "1", "size": str(size),
                             "chunk_size": str(chunk_size), "generation": gen,
                             "checksum": "sha256:" + "0" * 64, "mtime": "1.0"})
        for name in chunks:
            c.set(name, b"x" * chunk_size)
    return chunks


@pytest.mark.parametrize("size,chunk_size", [(10**15, 1 << 10), (1 << 40, 1 << 10),
                                             (1 << 62, 8 << 20)])
def test_rm_of_a_manifest_claiming_absurd_sizes_deletes_only_its_own_keys(
        redis_server: RedisServer, size: int, chunk_size: int) -> None:
    # Validated first (no chunk name built from its numbers), then removed as a damaged
    # object: its manifest, and only keys named as tensorstream names its chunks
    # (K:<16 hex>:<offset>); these forged ones are not, and stay.
    key = unique("forged")
    chunks = _forge(redis_server, key, size=size, chunk_size=chunk_size)
    out = _cli("rm", redis_server.url(key))
    assert out.returncode == 0, out
    assert "corrupt tensorstream manifest" in out.stderr
    assert "deleted the damaged object" in out.stderr
    assert "MemoryError" not in out.stderr and "Traceback" not in out.stderr
    with redis_server.client() as c:
        assert c.exists(key) == 0, "the damaged manifest is still there"
        assert c.exists(*chunks) == len(chunks), "keys not named as its chunks were deleted"


def test_reading_a_forged_manifest_is_refused_at_stat(redis_server: RedisServer) -> None:
    key = unique("forged")
    _forge(redis_server, key, size=10**15, chunk_size=1 << 10)
    with pytest.raises(errors.ProtocolError, match="corrupt tensorstream manifest"):
        _loop.run_sync(tensorstream.stat(redis_server.url(key)))
    with pytest.raises(errors.ProtocolError):
        tensorstream.open(redis_server.url(key)).read(10)


def test_rm_of_a_real_object_deletes_every_chunk(redis_server: RedisServer) -> None:
    key = unique("real")
    data = bytes(range(256)) * 40  # 10 KiB in 1 KiB chunks: 10 chunk keys
    with tensorstream.open(redis_server.url(key), "wb", redis_chunk_size=1 << 10) as f:
        f.write(data)
    with redis_server.client() as c:
        assert len(list(c.scan_iter(match=f"{key}:*"))) == 10
    out = _cli("rm", redis_server.url(key))
    assert out.returncode == 0, out
    with redis_server.client() as c:
        assert c.exists(key) == 0 and list(c.scan_iter(match=f"{key}*")) == []
