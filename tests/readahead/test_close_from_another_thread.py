"""A reader closed by another thread while a read waits: the read ends (exact
bytes or an error), it never hangs on read-ahead that will never be sent."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest

import tensorstream
from reader_threads import close_under_readers, read_until_closed
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("stream_reads", [False, True])
def test_a_read_ends_when_another_thread_closes_the_reader(http_server: HTTPTestServer, sequential: bool,
                                            stream_reads: bool) -> None:
    http_server.faults.reset()
    key = f"close-race-{os.urandom(4).hex()}"
    data = os.urandom(4 * MiB)
    http_server.put(key, data)
    http_server.faults.key = key
    http_server.faults.rate_limit = 1 * MiB
    out: list[object] = []
    f = tensorstream.open(http_server.url(key), sequential=sequential, part_size=256 << 10,
                          readahead=2 * MiB, stream_reads=stream_reads)

    def work() -> None:
        try:
            out.append(f.read())
        except BaseException as exc:  # reported below
            out.append(exc)

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.3)
    f.close()
    t.join(10)
    http_server.faults.reset()
    # Leave nothing running for the next test: the server's handlers of the
    # cut requests end (their garbage is collected here, not in a later test's
    # garbage count).
    http_server.bytes_sent(key, settle=5.0)
    gc.collect()
    assert not t.is_alive()
    assert out
    if isinstance(out[0], bytes):
        assert out[0] == data
    else:  # a file's error for a closed file, never an internal one
        assert isinstance(out[0], (OSError, ValueError)), repr(out[0])


def test_reads_of_threads_sharing_a_reader_end_when_it_is_closed(
        http_server: HTTPTestServer) -> None:
    """Two threads stream 1 MiB reads from one reader while a third closes it: each
    read ends (exact bytes or ValueError). One could wait for ever for its page
    fault-in helper, which the close had cancelled before any thread ran it."""
    key = f"close-shared-{os.urandom(4).hex()}"
    data = os.urandom(32 * MiB)
    http_server.put(key, data)
    try:
        for trial in range(30):
            f = tensorstream.open(http_server.url(key))
            errors: list[BaseException] = []

            def work(f: object = f, errors: list[BaseException] = errors) -> None:
                read_until_closed(f, data, errors, MiB)

            close_under_readers(f, [work, work], 0.002 * (trial % 10), f"(trial {trial})")
            assert not errors, errors
    finally:
        http_server.delete(key)
