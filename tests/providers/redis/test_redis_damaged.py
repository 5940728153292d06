"""What a lookup takes for an object's own keys (as a listing does), and the delete of a
damaged object (its own keys only) on one server and on a cluster; the CLI's side is in
tests/cli/test_cli_redis_damaged.py."""

from __future__ import annotations

import asyncio

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.redis_server import RedisCluster, RedisServer

GEN = "0123456789abcdef"
MANIFEST = {"tensorstream": "1", "size": "3", "chunk_size": "1000", "generation": GEN,
            "mtime": "1.0"}


def test_keys_under_a_name_with_no_to_redis_header_are_no_object_there(
        redis_server: RedisServer) -> None:
    """``stat K`` with only ``K:v:1`` beside it said "keys under 'K':* are not one
    contiguous stream", where ls lists K:v:1 as an object of its own and no K."""
    with redis_server.client() as c:
        c.set("dmg/plain:v:1", b"an object of its own")
    with pytest.raises(errors.NotFoundError, match="no such Redis object"):
        tensorstream.open(redis_server.url("dmg/plain"))
    with tensorstream.open(redis_server.url("dmg/plain:v:1")) as f:
        assert f.read() == b"an object of its own"


def test_a_to_redis_prefix_with_other_objects_under_it_reads_its_own_keys(
        redis_server: RedisServer) -> None:
    """A manifest (``P:m``, its chunk ``P:m:<generation>:0``) under a ``to_redis`` prefix
    ``P``: reading ``P`` failed with Redis's WRONGTYPE (STRLEN of the hash); a nested
    prefix with a header of its own (``P:sub:header:0``) was taken for P's bytes."""
    with redis_server.client() as c:
        c.set("dmg/tz:header:0", b"HEAD")
        c.set("dmg/tz:w:4", b"tensor")
        c.hset("dmg/tz:m", mapping=MANIFEST)
        c.set(f"dmg/tz:m:{GEN}:0", b"abc")
        c.set("dmg/tz:sub:header:0", b"other")
    with tensorstream.open(redis_server.url("dmg/tz")) as f:
        assert f.read() == b"HEADtensor"
    with tensorstream.open(redis_server.url("dmg/tz:m")) as f:
        assert f.read() == b"abc"
    with tensorstream.open(redis_server.url("dmg/tz:sub")) as f:
        assert f.read() == b"other"


async def _delete(uri: str) -> None:
    async with tensorstream.get_provider(uri) as provider:
        await provider.delete(tensorstream.uri.parse_uri(uri).path)


def test_a_damaged_object_on_a_cluster_is_deleted_with_its_own_keys(
        redis_cluster: RedisCluster) -> None:
    """Its keys sit on other nodes than its name's: each is deleted where it is."""
    with redis_cluster.client() as c:
        c.set("cdmg/tz:header:0", b"h" * 10)
        c.set("cdmg/tz:data:500", b"d")  # a gap: bytes 10-499 missing
        c.set("cdmg/tz2:header:0", b"beside it")
        c.hset("cdmg/man", mapping={**MANIFEST, "size": "-5"})
        c.set(f"cdmg/man:{GEN}:0", b"c")
        c.set("cdmg/man:notes", b"an object of its own")
    for name in ("cdmg/tz", "cdmg/man"):
        with pytest.raises(errors.ProtocolError):
            tensorstream.open(redis_cluster.url(name))
        asyncio.run(_delete(redis_cluster.url(name)))
        with pytest.raises(errors.NotFoundError):
            tensorstream.open(redis_cluster.url(name))
    with redis_cluster.client() as c:
        left = sorted(k for k in c.scan_iter(match="cdmg/*"))
        assert left == [b"cdmg/man:notes", b"cdmg/tz2:header:0"]
        c.delete(*left)
