"""The Redis writer's abort is final: nothing it sent lands after the clean-up.

A Redis command keeps running on the server when the client stops waiting
for it, so an abort that cancelled its chunks or its commit and then deleted
the chunks could be overtaken by them: a staged chunk left for a day (that
readers took for an object), or a manifest published over deleted chunks.
Each test holds one command in a TCP proxy in front of a real redis-server
until another command passes it (or 2 s pass): any command sent while one is
held is the abort not waiting for it.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import threading
import time
from typing import Any

import pytest

import tensorstream
from tensorstream.copy import copy
from tensorstream.testing.proxy import TCPFaultProxy
from tensorstream.testing.redis_server import RedisServer

CS = 16 << 10
_COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n")


#: A new connection's handshake, not a command of the writer's.
_HANDSHAKE = {"HELLO", "CLIENT", "AUTH", "SELECT", "PING", "..."}


class _Hold:
    """Holds the first client burst that ``matches`` until a burst with another
    command comes (not a handshake, not one of ``also``; or 2 s pass), and
    records the first command of every burst in order."""

    def __init__(self, matches: Any, also: frozenset[str] = frozenset()) -> None:
        self.matches = matches
        self.ignored = _HANDSHAKE | also
        self.seen: list[str] = []
        self.held = threading.Event()
        self._other = False
        self._done = False

    async def __call__(self, data: bytes) -> None:
        m = _COMMAND.match(data)
        name = m.group(1).decode().upper() if m else "..."
        if b"unpack(ARGV, 2)" in data:  # the writer's publish script
            name = "PUBLISH"
        if self.held.is_set() and not self._done and name not in self.ignored:
            self._other = True
        if self._done or not self.matches(data):
            self.seen.append(name)
            return
        self.seen.append(f"held {name}")
        self.held.set()
        deadline = time.monotonic() + 2
        while not self._other and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self._done = True
        self.seen.append("released")


def _after_hold(seen: list[str]) -> list[str]:
    at = next(i for i, s in enumerate(seen) if s.startswith("held"))
    return seen[at:]


@pytest.fixture
def proxy(redis_server: RedisServer) -> Any:
    with TCPFaultProxy(redis_server.host, redis_server.port) as p:
        yield p


def _left(redis_server: RedisServer, key: str) -> list[bytes]:
    with redis_server.client() as c:
        return sorted(c.scan_iter(match=f"{key}*", count=10_000))  # (one SCAN: not every key)


@pytest.mark.parametrize("stopped", ["write", "commit", "beside"])
def test_a_chunk_in_flight_lands_before_the_abort_cleans_up(
        redis_server: RedisServer, proxy: TCPFaultProxy, stopped: str) -> None:
    """Aborted while a chunk is on its way: after the writes, once the commit
    that waits for the chunks is stopped, or beside that commit (which then
    must not publish)."""
    key = f"wr-{secrets.token_hex(4)}/m"
    hold = _Hold(lambda d: f"{key}:".encode() in d and b"\r\nSET\r\n" in d[:40]
                 and re.search(rb":%d\r\n" % (2 * CS), d) is not None,
                 also=frozenset({"SET"}))  # the other chunks are written meanwhile
    proxy.faults.on_client_data = hold

    async def run() -> None:
        async with tensorstream.get_provider(f"redis://127.0.0.1:{proxy.port}/",
                                             redis_chunk_size=CS) as p:
            w = p.open_writer(key)
            await w.write(os.urandom(4 * CS))  # four chunks go out; the third is held
            await asyncio.to_thread(hold.held.wait, 10)
            if stopped == "write":
                await w.abort()
                return
            commit = asyncio.ensure_future(w.commit())
            await asyncio.sleep(0.05)  # the commit waits for the chunks
            if stopped == "commit":
                commit.cancel()
                await asyncio.gather(commit, return_exceptions=True)
                await w.abort()
            else:
                await asyncio.gather(w.abort(), commit, return_exceptions=True)

    asyncio.run(run())
    assert hold.held.is_set()
    after = [s for s in _after_hold(hold.seen) if s not in hold.ignored]
    assert after[:2] == ["held SET", "released"], hold.seen
    assert _left(redis_server, key) == []


def _first_version(redis_server: RedisServer, key: str) -> bytes:
    data = os.urandom(3 * CS)
    with tensorstream.open(redis_server.url(key), "wb", redis_chunk_size=CS) as f:
        f.write(data)
    return data


def _abort_during_commit(proxy: TCPFaultProxy, key: str, hold: _Hold, *,
                         stop_commit: bool) -> BaseException | None:
    """Write a second version through ``proxy`` and abort it once ``hold`` holds a
    command of its commit; ``stop_commit``: cancel the commit first (as ``cp`` is
    stopped), else abort beside it. Returns how the commit ended (None: success)."""
    proxy.faults.on_client_data = hold
    outcome: list[BaseException | None] = []

    async def run() -> None:
        async with tensorstream.get_provider(f"redis://127.0.0.1:{proxy.port}/",
                                             redis_chunk_size=CS) as p:
            w = p.open_writer(key)
            await w.write(os.urandom(2 * CS + 5))
            commit = asyncio.ensure_future(w.commit())
            await asyncio.to_thread(hold.held.wait, 10)
            if stop_commit:
                commit.cancel()
                await asyncio.gather(commit, return_exceptions=True)
            await w.abort()
            outcome.extend(await asyncio.gather(commit, return_exceptions=True))

    asyncio.run(run())
    assert hold.held.is_set()
    return outcome[0]


def test_an_abort_while_the_commit_persists_the_chunks_stops_the_publish(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """Aborted (from another task) while the commit's ``PERSIST`` pipeline is on
    its way: the publish is never sent, and the previous version stays whole."""
    key = f"wr-{secrets.token_hex(4)}/m"
    v1 = _first_version(redis_server, key)
    hold = _Hold(lambda d: d.startswith(b"*2\r\n$7\r\nPERSIST\r\n"))
    outcome = _abort_during_commit(proxy, key, hold, stop_commit=False)
    after = [s for s in _after_hold(hold.seen) if s not in hold.ignored]
    assert after[:2] == ["held PERSIST", "released"], hold.seen
    assert "PUBLISH" not in hold.seen, hold.seen
    assert isinstance(outcome, Exception), outcome  # the commit says it did not publish
    with tensorstream.open(redis_server.url(key)) as f:
        assert f.read() == v1
    gen = tensorstream.open(redis_server.url(key)).info.etag
    assert all(k.decode().startswith(f"{key}:{gen}:") for k in _left(redis_server, key)
               if k != key.encode())


def test_a_publish_in_flight_when_the_commit_is_stopped_is_removed_by_the_abort(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """The commit is stopped (as ``cp`` stops it) while the ``EVAL`` that
    publishes is on its way, then the writer is aborted: the publish lands
    first and is removed again -- never a manifest left over chunks the abort
    deleted. The previous version is gone (the publish replaced it), and so
    are its chunks, which nothing refers to."""
    key = f"wr-{secrets.token_hex(4)}/m"
    _first_version(redis_server, key)
    hold = _Hold(lambda d: b"unpack(ARGV, 2)" in d)
    _abort_during_commit(proxy, key, hold, stop_commit=True)
    after = [s for s in _after_hold(hold.seen) if s not in hold.ignored]
    assert after[:2] == ["held PUBLISH", "released"], hold.seen
    assert _left(redis_server, key) == []
    with pytest.raises(tensorstream.errors.NotFoundError):
        tensorstream.open(redis_server.url(key)).close()


class _Both:
    """Two holds in turn: ``first`` until it released, then ``second``."""

    def __init__(self, first: _Hold, second: _Hold) -> None:
        self.first, self.second = first, second

    async def __call__(self, data: bytes) -> None:
        if not self.first._done:
            await self.first(data)
        else:
            await self.second(data)


def _is_delete(data: bytes) -> bool:
    m = _COMMAND.match(data)
    return m is not None and m.group(1).upper() in (b"DEL", b"UNLINK")


def test_a_commit_whose_writer_was_aborted_while_it_waited_never_publishes(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """The commit waits for a chunk while the writer is aborted beside it; the
    abort's clean-up (``DEL``) is then held, so a commit that went on to publish
    once its chunk landed would get its manifest past the clean-up and leave it
    over deleted chunks. It must raise instead, and leave nothing behind."""
    key = f"wr-{secrets.token_hex(4)}/m"
    chunk = _Hold(lambda d: f"{key}:".encode() in d and b"\r\nSET\r\n" in d[:40]
                  and re.search(rb":%d\r\n" % (2 * CS), d) is not None,
                  also=frozenset({"SET"}))
    # Held until the publish passes it (or 2 s): only a publish can overtake it.
    delete = _Hold(_is_delete, also=frozenset({"SET", "PERSIST", "STRLEN", "EVAL", "EVALSHA", "MULTI",
                                   "GET", "EXEC"}))
    proxy.faults.on_client_data = _Both(chunk, delete)
    outcome: list[BaseException | None] = []

    async def run() -> None:
        async with tensorstream.get_provider(f"redis://127.0.0.1:{proxy.port}/",
                                             redis_chunk_size=CS) as p:
            w = p.open_writer(key)
            await w.write(os.urandom(4 * CS))
            await asyncio.to_thread(chunk.held.wait, 10)
            commit = asyncio.ensure_future(w.commit())
            await asyncio.sleep(0.05)  # the commit waits for the held chunk
            results = await asyncio.gather(w.abort(), commit, return_exceptions=True)
            outcome.append(results[1])

    asyncio.run(run())
    assert chunk.held.is_set() and delete.held.is_set(), (chunk.seen, delete.seen)
    assert "PUBLISH" not in chunk.seen + delete.seen, (chunk.seen, delete.seen)
    assert isinstance(outcome[0], ValueError), outcome
    assert _left(redis_server, key) == []
    with pytest.raises(tensorstream.errors.NotFoundError):
        tensorstream.open(redis_server.url(key)).close()


class _LoseAnswer:
    """The first client burst that ``matches`` goes to the server, and its answer
    is lost: the connection's replies are held, then every connection through
    the proxy is cut (as a dropped link does) and service resumes."""

    def __init__(self, proxy: TCPFaultProxy, matches: Any) -> None:
        self.proxy, self.matches, self.done = proxy, matches, False

    async def __call__(self, data: bytes) -> None:
        if self.done or not self.matches(data):
            return
        self.done = True
        self.proxy.faults.stall = True

        def cut() -> None:
            time.sleep(0.3)  # the command reached the server and ran
            self.proxy.cut_all()
            self.proxy.faults.stall = False

        threading.Thread(target=cut, daemon=True).start()


def _keys_of(redis_server: RedisServer, key: str) -> tuple[list[bytes], list[bytes]]:
    """(persistent keys, keys with a TTL) named ``key`` or ``key:...``."""
    with redis_server.client() as c:
        keys = [k for k in _left(redis_server, key) if k == key.encode() or
                k.startswith(key.encode() + b":")]
        return ([k for k in keys if c.ttl(k) == -1], [k for k in keys if c.ttl(k) != -1])


def test_a_publish_whose_answer_was_lost_is_the_success_it_was(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """Redis ran the publish, and its answer was lost (the connection dropped).
    The write failed, and its abort removed the new manifest: neither version
    was left (a read named chunks of two generations), and the chunks of both
    stayed for ever (made persistent). The manifest is looked at: it is this
    writer's, so the write succeeded, and the previous generation is dropped."""
    key = f"wr-{secrets.token_hex(4)}/m"
    _first_version(redis_server, key)
    proxy.faults.on_client_data = _LoseAnswer(proxy, lambda d: b"unpack(ARGV, 2)" in d)
    data = os.urandom(5 * CS)
    with tensorstream.open(f"redis://127.0.0.1:{proxy.port}/{key}", "wb",
                           redis_chunk_size=CS) as f:
        f.write(data)
    assert proxy.faults.on_client_data.done
    assert tensorstream.open(redis_server.url(key)).read() == data
    persistent, expiring = _keys_of(redis_server, key)
    assert len(persistent) == 1 + 5 and expiring == []  # the manifest and its chunks only


def test_a_commit_whose_answer_was_lost_before_the_publish_keeps_the_previous_version(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """The neighbour: the answer lost is the one to the commit's first step
    (the chunks made persistent), so nothing was published: with no attempt left
    (``retries=1``; else it is sent again: ``test_redis_write_drops.py``) the write
    fails, the previous version stays, and the new chunks are removed."""
    key = f"wr-{secrets.token_hex(4)}/m"
    first = _first_version(redis_server, key)
    proxy.faults.on_client_data = _LoseAnswer(proxy, lambda d: b"PERSIST" in d)
    with pytest.raises(tensorstream.errors.ConnectionFailedError), \
            tensorstream.open(f"redis://127.0.0.1:{proxy.port}/{key}", "wb",
                              redis_chunk_size=CS, retries=1) as f:
        f.write(os.urandom(5 * CS))
    assert tensorstream.open(redis_server.url(key)).read() == first
    persistent, expiring = _keys_of(redis_server, key)
    assert len(persistent) == 1 + 3 and expiring == []


def test_the_previous_generation_is_deleted_when_a_connection_drops_first(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """The publish succeeded; the connection then drops as the previous
    generation's chunks are deleted (before the DEL reached Redis). They were
    left with a warning, persistent, for ever: a whole model's worth of memory.
    The delete is sent again on a fresh connection."""
    key = f"wr-{secrets.token_hex(4)}/m"
    _first_version(redis_server, key)
    cut = {"done": False}

    async def drop_first_delete(data: bytes) -> None:
        if not cut["done"] and _is_delete(data):
            cut["done"] = True
            raise ConnectionResetError("the link dropped")  # the burst is never forwarded

    proxy.faults.on_client_data = drop_first_delete
    data = os.urandom(5 * CS)
    with tensorstream.open(f"redis://127.0.0.1:{proxy.port}/{key}", "wb",
                           redis_chunk_size=CS) as f:
        f.write(data)
    assert cut["done"]
    assert tensorstream.open(redis_server.url(key)).read() == data
    persistent, expiring = _keys_of(redis_server, key)
    assert len(persistent) == 1 + 5 and expiring == []  # no chunk of the previous one left


def test_a_failed_commit_removes_its_persistent_chunks_when_a_connection_drops_first(
        redis_server: RedisServer, proxy: TCPFaultProxy) -> None:
    """The commit made the chunks persistent, then its publish failed (the link
    dropped before it reached Redis; ``retries=1``: not sent again), and the
    abort's delete of the chunks met a dropped connection too: they were left,
    persistent, for ever. The abort's clean-up is sent again; the previous
    version is whole."""
    key = f"wr-{secrets.token_hex(4)}/m"
    first = _first_version(redis_server, key)
    dropped: list[str] = []

    async def drop(data: bytes) -> None:
        if "publish" not in dropped and b"unpack(ARGV, 2)" in data:
            dropped.append("publish")
            raise ConnectionResetError("the link dropped")
        if "publish" in dropped and "delete" not in dropped and _is_delete(data):
            dropped.append("delete")
            raise ConnectionResetError("the link dropped")

    proxy.faults.on_client_data = drop
    with pytest.raises(tensorstream.errors.ConnectionFailedError), \
            tensorstream.open(f"redis://127.0.0.1:{proxy.port}/{key}", "wb",
                              redis_chunk_size=CS, retries=1) as f:
        f.write(os.urandom(5 * CS))
    assert dropped == ["publish", "delete"]
    assert tensorstream.open(redis_server.url(key)).read() == first
    persistent, expiring = _keys_of(redis_server, key)
    assert len(persistent) == 1 + 3 and expiring == []


def test_a_write_larger_than_a_volatile_lru_redis_holds_says_evicted() -> None:
    """Chunks being written carry an expiry, so volatile-* policies evict them
    first: a write bigger than the free memory lost its own chunks and failed with
    "vanished before commit (expired or deleted)", a 24 h expiry that cannot have
    run out. It names maxmemory now; the previous version is untouched."""
    with RedisServer() as srv, srv.client() as c:
        _write_to(srv.url("evicted/m"), b"v1" * 1000)
        used = int(c.info("memory")["used_memory"])
        c.config_set("maxmemory", str(used + (4 << 20)))
        c.config_set("maxmemory-policy", "volatile-lru")
        with pytest.raises(tensorstream.errors.ObjectChangedError, match="maxmemory"):
            _write_to(srv.url("evicted/m"), os.urandom(8 << 20), retries=1)
        with tensorstream.open(srv.url("evicted/m")) as f:
            assert f.read() == b"v1" * 1000


def _write_to(uri: str, data: bytes, **options: Any) -> None:
    with tensorstream.open(uri, "wb", redis_chunk_size=64 << 10, **options) as f:
        f.write(data)


@pytest.mark.parametrize("how", ["write", "cp"])
def test_a_chunk_over_proto_max_bulk_len_names_the_limit(how: str, tmp_path: Any) -> None:
    """Redis drops the connection of a client sending a value longer than its
    proto-max-bulk-len: a write with the default 4 MiB chunks to a server set to
    1 MiB failed with "Connection reset by peer". It names the limit now."""
    with RedisServer() as srv, srv.client() as c:
        c.config_set("proto-max-bulk-len", str(1 << 20))
        if how == "write":
            with pytest.raises(tensorstream.errors.ConfigurationError,
                               match=r"proto-max-bulk-len.*redis_chunk_size=1048576"):
                with tensorstream.open(srv.url("bulk/m"), "wb") as f:
                    f.write(os.urandom(5 << 20))
        else:
            src = tmp_path / "m"
            src.write_bytes(os.urandom(5 << 20))
            result = copy(str(src), srv.url("bulk/m"))
            assert not result.ok and "proto-max-bulk-len" in result.errors[0], result.errors
        assert _keys_of(srv, "bulk/m") == ([], [])
        # ... and the advice works
        with tensorstream.open(srv.url("bulk/m"), "wb", redis_chunk_size=1 << 20) as f:
            f.write(b"x" * (3 << 20))
