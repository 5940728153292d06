"""The HTTP test server's own accounting (``tensorstream.testing.http_server``)."""
from __future__ import annotations

import threading
import urllib.request

from tensorstream.testing.http_server import HTTPTestServer


def test_bytes_sent_counts_a_body_the_client_is_still_receiving() -> None:
    # The client has bytes before the server's handler counts them; bytes_sent
    # waits for bodies in progress instead of answering with a partial count.
    body = bytes(range(256)) * 1024  # 256 KiB
    with HTTPTestServer() as server:
        server.put("acct/blob", body)
        server.faults.rate_limit = 512 << 10  # ~0.5 s for the whole body
        first_byte = threading.Event()
        received: list[bytes] = []

        def fetch() -> None:
            with urllib.request.urlopen(server.url("acct/blob"), timeout=30) as r:
                head = r.read(1)
                first_byte.set()
                received.append(head + r.read())

        t = threading.Thread(target=fetch)
        t.start()
        assert first_byte.wait(30)
        assert server.bytes_sent("acct/blob") == len(body)
        assert server.bytes_sent() == len(body)
        t.join(30)
        assert received == [body]


def test_bytes_sent_gives_up_waiting_after_settle() -> None:
    body = b"x" * (256 << 10)
    with HTTPTestServer() as server:
        server.put("acct/slow", body)
        server.faults.rate_limit = 64 << 10  # 4 s for the body
        started = threading.Event()

        def fetch() -> None:
            with urllib.request.urlopen(server.url("acct/slow"), timeout=30) as r:
                r.read(1)
                started.set()
                r.read()

        t = threading.Thread(target=fetch)
        t.start()
        assert started.wait(30)
        assert 0 < server.bytes_sent("acct/slow", settle=0.2) < len(body)
        t.join(30)
