"""A Redis reader closed while its read-ahead waits on the server: the reads in
flight stop with the close, as HTTP's do. They went on until the server answered
(a paused or slow server: for as long as the idle timeout, 30 s), holding the
read-ahead's threads, which the interpreter's exit waits for."""

from __future__ import annotations

import os
import threading
import time

import tensorstream
from tensorstream.testing.redis_server import RedisServer

MiB = 1 << 20
PAUSE_MS = 6000



def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tensorstream-fetch_")]


def test_closing_a_reader_stops_its_reads_waiting_on_a_paused_server(
        private_redis: RedisServer) -> None:
    data = os.urandom(8 * MiB)
    private_redis.put("model.bin", data)
    f = tensorstream.open(private_redis.url("model.bin"), part_size=256 << 10)
    assert f.read(MiB) == data[:MiB]
    out: list[object] = []

    def work() -> None:
        try:
            out.append(f.read())
        except BaseException as exc:  # reported below
            out.append(exc)

    with private_redis.client() as admin:
        admin.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "ALL")
    paused = time.monotonic()
    reader = threading.Thread(target=work)
    reader.start()
    time.sleep(0.5)  # the read and its read-ahead now wait on the server
    f.close()
    reader.join(10)
    while _fetch_threads() and time.monotonic() - paused < PAUSE_MS / 1000 + 5:
        time.sleep(0.02)
    stopped = time.monotonic() - paused
    time.sleep(max(0.0, PAUSE_MS / 1000 + 0.2 - stopped))  # the server answers again
    assert not reader.is_alive()
    assert out and (out[0] == data[MiB:] or isinstance(out[0], (OSError, ValueError))), out
    assert stopped < 3.0, f"the reads in flight went on for {stopped:.1f} s after the close"
    # The provider still serves a reader opened afterwards.
    with tensorstream.open(private_redis.url("model.bin")) as g:
        assert g.read() == data


def test_closes_with_reads_in_flight_leave_no_read_running(redis_server: RedisServer) -> None:
    """Closed again and again with its read-ahead in flight (a load cut short), no
    read of the read-ahead goes on: about one close in ten cut a read in redis-py's
    handshake, which then waited out the idle timeout (30 s) for an answer."""
    data = os.urandom(4 * MiB)
    key = f"close-{os.urandom(4).hex()}"
    redis_server.put(key, data)
    for i in range(40):
        f = tensorstream.open(redis_server.url(key), part_size=64 << 10)
        assert f.read(MiB) == data[:MiB]
        f.close()
        closed = time.monotonic()
        while _fetch_threads() and time.monotonic() - closed < 5:
            time.sleep(0.01)
        assert not _fetch_threads(), f"close {i}: reads still ran 5 s after it"
