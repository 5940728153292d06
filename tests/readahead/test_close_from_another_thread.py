"""A reader closed by another thread while a read waits: the read ends (exact
bytes or an error), it never hangs on read-ahead that will never be sent."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest

import tensorstream
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
