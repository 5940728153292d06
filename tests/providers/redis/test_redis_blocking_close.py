"""The read-ahead's first reads of a Redis object start at once, each in a worker
thread, on the blocking path. Each could make the provider's blocking client:
the one made last was kept, and ``close()`` closed only that one, so the reads
on the others went on after the close (on a paused or slow server, until it
answered or the idle timeout ran out: the workers, and the exit waiting for
them, were held), their connections open until then.

The race is between threads: each round gives it twelve providers, one after
another within one pause of the server, with the GIL switching often (it was
caught in about 3 providers of 10 without the fix, so every run here caught it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tensorstream
from tensorstream import _loop
from tensorstream.providers.base import Pin
from tensorstream.testing.redis_server import RedisServer

PROVIDERS, THREADS, ROUNDS = 12, 16, 2
PAUSE_MS = 4000


@pytest.fixture
def switch_often() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


def _read(provider: Any, path: str, pin: Pin, start: threading.Barrier,
          failed: list[BaseException]) -> None:
    buf = bytearray(64 << 10)
    start.wait()
    try:
        provider.readinto_blocking(path, 0, memoryview(buf), pin=pin)
    except OSError:
        pass  # cut by the close: what it should be
    except BaseException as exc:  # reported by the test
        failed.append(exc)


def test_close_stops_every_blocking_read_started_at_once(
        private_redis: RedisServer, switch_often: None) -> None:
    uri = private_redis.url("model.bin")
    data = os.urandom(1 << 20)
    with tensorstream.open(uri, "wb") as f:  # a manifest: reads take the blocking path
        f.write(data)
    path = tensorstream.parse_uri(uri).path
    admin = private_redis.client()
    admin.ping()  # (connected before the pause: a new connection's handshake waits too)
    try:
        for round_ in range(ROUNDS):
            providers = [tensorstream.get_provider(uri).inner for _ in range(PROVIDERS)]
            pins = [Pin.of(_loop.run_sync(p.stat(path))) for p in providers]
            failed: list[BaseException] = []
            admin.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "ALL")
            paused = time.monotonic()
            workers: list[threading.Thread] = []
            for i in range(PROVIDERS):  # one provider's reads at a time, all at once
                start = threading.Barrier(THREADS)
                workers += [threading.Thread(target=_read, daemon=True, args=(
                    providers[i], path, pins[i], start, failed)) for _ in range(THREADS)]
                for w in workers[-THREADS:]:
                    w.start()
                time.sleep(0.1)  # its reads now wait on the paused server
            for p in providers:
                _loop.run_sync(p.close())
            closed = time.monotonic()
            assert closed - paused < PAUSE_MS / 1000 - 1.0  # (the test's own timing)
            for w in workers:
                w.join(max(0.0, closed + 0.8 - time.monotonic()))
            running = sum(w.is_alive() for w in workers)
            time.sleep(max(0.0, paused + PAUSE_MS / 1000 + 0.1 - time.monotonic()))
            for w in workers:
                w.join(10)
            assert running == 0, (f"round {round_}: {running} reads went on after close() "
                                  "until the server answered")
            assert not failed, failed
    finally:
        admin.close()
