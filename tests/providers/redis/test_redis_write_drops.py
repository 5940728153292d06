"""A Redis write survives a dropped connection: each step is sent again under the
retry policy, through the package's TCP fault proxy in front of a real redis-server.

A drop either cuts a command before the server saw it ("lost": nothing ran) or cuts
its answer once it ran ("answered": it ran, the writer cannot tell). Afterwards the
object reads back exactly, or the write raised and the old object is intact; never a
chunk of ours without its expiry but the published generation's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redis_cuts import STEPS, Cut

import tensorstream
from tensorstream import errors
from tensorstream.testing.redis_backend import RedisBackend

CS = 16 << 10
#: A quick budget (the policy's own numbers), so a test of every attempt failing is short.
FAST = {"redis_chunk_size": CS, "retries": 4, "backoff_initial": 0.01, "backoff_max": 0.05}


def _write(store: RedisBackend, key: str, data: bytes) -> None:
    with tensorstream.open(store.uri(key), "wb", **store.options, **FAST) as f:
        f.write(data)


def _keys_of(store: RedisBackend, key: str) -> dict[bytes, int]:
    """Every chunk key of ``key`` and its TTL (-1: persistent)."""
    path = store.key(key)
    keys = store.client.scan_iter(match=f"{path}:*", count=10_000)
    return {k: store.client.ttl(k) for k in keys}


def _only_published_persist(store: RedisBackend, key: str) -> None:
    gen = store.client.hget(store.key(key), "generation")
    left = {k: t for k, t in _keys_of(store, key).items()
            if t == -1 and (gen is None or f":{gen.decode()}:".encode() not in k)}
    assert left == {}, "chunks of ours left without their expiry"


@pytest.mark.parametrize("n", [0, 5, 20])
def test_a_write_survives_a_dropped_connection(tensorstream_redis: RedisBackend, n: int) -> None:
    # was: ConnectionFailedError at commit, every time
    data = os.urandom(100_000)
    tensorstream_redis.faults.drop_after(n, times=1)
    _write(tensorstream_redis, "w", data)
    assert tensorstream_redis.faults.raw.dropped == 1
    assert tensorstream_redis.get("w") == data
    _only_published_persist(tensorstream_redis, "w")




@pytest.mark.parametrize("how", ["lost", "answered"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_drop_at_each_step_is_sent_again(
        tensorstream_redis: RedisBackend, step: str, how: str) -> None:
    old, new = os.urandom(3 * CS + 7), os.urandom(5 * CS + 11)
    _write(tensorstream_redis, "s", old)
    before = set(_keys_of(tensorstream_redis, "s"))
    cut = Cut(tensorstream_redis.faults.raw, STEPS[step], how)
    tensorstream_redis.faults.raw.on_client_data = cut
    _write(tensorstream_redis, "s", new)
    assert cut.cut == 1
    tensorstream_redis.faults.reset()
    assert tensorstream_redis.get("s") == new
    left = _keys_of(tensorstream_redis, "s")
    assert not before & set(left), "the old generation's chunks stayed"
    assert all(t == -1 for t in left.values()), left  # the new generation's, all of them
    assert len(left) == 6


@pytest.mark.parametrize("step", list(STEPS))
def test_drops_on_every_attempt_fail_after_the_budget(
        tensorstream_redis: RedisBackend, step: str) -> None:
    """Every attempt cut before the server saw it: the write fails, temporary, once the
    budget is spent; the old object intact, the new one's chunks removed."""
    old = os.urandom(3 * CS + 7)
    _write(tensorstream_redis, "e", old)
    cut = Cut(tensorstream_redis.faults.raw, STEPS[step], "lost", times=1 << 30)
    tensorstream_redis.faults.raw.on_client_data = cut
    with pytest.raises(errors.TensorstreamError) as failed:
        _write(tensorstream_redis, "e", os.urandom(5 * CS + 11))
    assert failed.value.temporary
    # every attempt sent, none more (chunks: each pipeline in flight has its own budget)
    assert cut.cut == FAST["retries"] if step != "chunks" else cut.cut >= FAST["retries"]
    tensorstream_redis.faults.reset()
    assert tensorstream_redis.get("e") == old
    _only_published_persist(tensorstream_redis, "e")
    with tensorstream.open(tensorstream_redis.uri("e"), "rb", **tensorstream_redis.options) as f:
        assert f.read() == old


def test_a_persisted_chunk_that_vanished_still_fails_the_commit(
        tensorstream_redis: RedisBackend) -> None:
    """The neighbour: PERSIST's 0 for a chunk that is gone (not one made persistent by an
    attempt before) still fails the write, and nothing is published."""
    old = os.urandom(CS)
    _write(tensorstream_redis, "v", old)
    store = tensorstream_redis

    async def evict(data: bytes) -> None:
        if b"PERSIST" in data:
            for k in list(_keys_of(store, "v")):
                if store.client.ttl(k) != -1:
                    store.client.delete(k)

    store.faults.raw.on_client_data = evict
    with pytest.raises(errors.ObjectChangedError, match="vanished"):
        _write(store, "v", os.urandom(2 * CS))
    store.faults.reset()
    assert store.get("v") == old




def test_a_publish_sent_again_after_failed_looks_still_drops_the_old_generation(
        tensorstream_redis: RedisBackend) -> None:
    """The publish's answer lost and every look at the manifest after it cut: the
    publish is sent again, replaces its own manifest, and the generation the first one
    replaced still goes (was it taken for the previous one, its chunks stayed for ever)."""
    store = tensorstream_redis
    old, new = os.urandom(2 * CS), os.urandom(3 * CS)
    _write(store, "l", old)
    before = set(_keys_of(store, "l"))
    publish = Cut(store.faults.raw, STEPS["publish"], "answered")
    looks = Cut(store.faults.raw, b"return false", "lost", times=3)

    async def hook(data: bytes) -> None:
        await publish(data)
        if publish.cut and b"PERSIST" not in data:
            await looks(data)

    store.faults.raw.on_client_data = hook
    _write(store, "l", new)
    assert (publish.cut, looks.cut) == (1, 3)
    store.faults.reset()
    assert store.get("l") == new
    left = _keys_of(store, "l")
    assert not before & set(left), "the old generation's chunks stayed"
    assert len(left) == 3 and all(t == -1 for t in left.values())


@pytest.mark.parametrize("how", ["lost", "answered"])
def test_cp_into_redis_survives_a_dropped_connection(
        tensorstream_redis: RedisBackend, tmp_path: Path, how: str) -> None:
    """``cp``'s parts (chunks staged and read back in one ``MULTI``) are sent again too."""
    from tensorstream.copy import copy

    store = tensorstream_redis
    src = tmp_path / "m"
    data = os.urandom(6 * CS + 3)
    src.write_bytes(data)
    cut = Cut(store.faults.raw, b"\r\nMULTI\r\n", how)
    store.faults.raw.on_client_data = cut
    result = copy(str(src), store.uri("c"), **store.options, **FAST)
    assert result.ok, result.errors
    assert cut.cut == 1
    store.faults.reset()
    assert store.get("c") == data
    left = _keys_of(store, "c")
    assert len(left) == 7 and all(t == -1 for t in left.values())


def test_a_publish_replaced_before_its_look_is_not_sent_again_over_the_other_writer(
        tensorstream_redis: RedisBackend) -> None:
    """The publish ran and its answer was lost; before the look, another writer
    published and deleted this write's chunks (they were the previous generation to
    it). The look sees another generation: sent again, the publish put a manifest over
    deleted chunks (every read failed). The write happened and was replaced: the other
    writer's object stays, and the generation this one replaced still goes."""
    store = tensorstream_redis
    old, new, other = os.urandom(2 * CS), os.urandom(3 * CS), os.urandom(4 * CS)
    _write(store, "r", old)
    publish = Cut(store.faults.raw, STEPS["publish"], "answered")
    replaced: list[bool] = []

    async def hook(data: bytes) -> None:
        await publish(data)
        if publish.cut and not replaced and b"return false" in data and b"PERSIST" not in data:
            replaced.append(True)
            store.put("r", other, chunk_size=CS)  # (its own connection, past the proxy)

    store.faults.raw.on_client_data = hook
    _write(store, "r", new)
    assert replaced == [True]
    store.faults.reset()
    assert store.get("r") == other
    with tensorstream.open(store.uri("r"), "rb", **store.options) as f:
        assert f.read() == other
    left = _keys_of(store, "r")
    assert len(left) == 4 and all(t == -1 for t in left.values()), left


def test_an_abort_during_the_wait_before_a_resend_sends_nothing_more(
        tensorstream_redis: RedisBackend) -> None:
    """A chunk's SET cut, the writer aborted while it waits to send it again: the
    resend is not sent (it would land after the abort began), the abort removes what
    was staged, and the previous version stays."""
    import asyncio

    store = tensorstream_redis
    old = os.urandom(CS)
    _write(store, "a", old)
    cut = Cut(store.faults.raw, STEPS["chunks"], "lost")
    sets_after: list[bytes] = []
    aborted = False

    async def hook(data: bytes) -> None:
        if aborted and b"\r\nSET\r\n" in data:
            sets_after.append(data[:60])
        await cut(data)

    store.faults.raw.on_client_data = hook
    slow = {**FAST, "backoff_initial": 1.0, "backoff_max": 1.0}

    async def run() -> None:
        nonlocal aborted
        async with tensorstream.get_provider(store.uri(""), **store.options, **slow) as p:
            w = p.open_writer(store.key("a"))
            await w.write(os.urandom(2 * CS))
            while not cut.cut:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the resend waits its backoff
            aborted = True
            await w.abort()

    asyncio.run(run())
    assert sets_after == []
    store.faults.reset()
    assert store.get("a") == old
    _only_published_persist(store, "a")
    assert len(_keys_of(store, "a")) == 1


def test_a_publish_over_another_writers_newer_object_whose_answer_was_lost_leaves_nothing(
        tensorstream_redis: RedisBackend) -> None:
    """Another writer published between this write's PERSIST (which saw the old
    object) and its publish, which then ran over it and lost its answer. The look found
    this write's manifest, and the write dropped the generation its PERSIST had seen
    (already gone) -- not the one it replaced: the other writer's chunks, persistent,
    stayed for ever with no manifest naming them. Now the publish goes only over the
    manifest the PERSIST saw, even the first time: the other writer's object stays, as
    when this write happened first, and no chunk is left but the published ones."""
    store = tensorstream_redis
    old, new, other = os.urandom(2 * CS), os.urandom(3 * CS), os.urandom(4 * CS)
    _write(store, "n", old)
    publish = Cut(store.faults.raw, STEPS["publish"], "answered")

    async def hook(data: bytes) -> None:
        if STEPS["publish"] in data and not publish.cut:
            store.put("n", other, chunk_size=CS)  # (its own connection, past the proxy)
        await publish(data)

    store.faults.raw.on_client_data = hook
    _write(store, "n", new)
    assert publish.cut == 1
    store.faults.reset()
    _only_published_persist(store, "n")
    assert store.get("n") == other
    left = _keys_of(store, "n")
    assert len(left) == 4 and all(t == -1 for t in left.values()), left
