"""The HTTP test server's own accounting (``tensorstream.testing.http_server``)."""
from __future__ import annotations

import http.client
import threading
import time
import urllib.error
import urllib.request

import pytest
from client_hang_up import hang_up, warnings_logged

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


@pytest.mark.parametrize("fault", ["latency", "stall_after_headers", "rate_limit"])
def test_a_client_hanging_up_is_not_logged_as_a_server_error(
        caplog: pytest.LogCaptureFixture, fault: str) -> None:
    # A client that gave up waiting out a latency (or a stall, or a slow body) hangs
    # up; the server's next write failed and aiohttp logged "Error handling request"
    # with a ClientConnectionResetError traceback. Only the body's writes were covered.
    with HTTPTestServer() as server:
        server.put("acct/blob", b"x" * (256 << 10))
        setattr(server.faults, fault, 64 << 10 if fault == "rate_limit" else 0.5)
        hang_up(server.port, "/acct/blob", after_headers=fault != "latency")
        deadline = time.monotonic() + 10
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.8)  # (past the fault: the server's next write meets the hang-up)
        assert warnings_logged(caplog) == []
        setattr(server.faults, fault, 0 if fault != "rate_limit" else None)
        with urllib.request.urlopen(server.url("acct/blob"), timeout=30) as r:
            assert r.read() == b"x" * (256 << 10)


def _status_of_next_get(server: HTTPTestServer) -> int:
    try:
        with urllib.request.urlopen(server.url("acct/blob"), timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize("how", ["client-hangs-up", "cancel_requests"])
def test_a_request_gone_during_the_latency_takes_no_scripted_status(how: str) -> None:
    """``status_script`` entries go to requests answered: one whose client hung up
    during ``latency`` took the next entry after the latency (the 503 a test scripted
    for its retry was spent on a closed connection, and the retry got 200). An entry
    stays for the next request now, whether the client left or ``cancel_requests``
    ended the request."""
    with HTTPTestServer() as server:
        server.put("acct/blob", b"x")
        server.faults.status_script = [503]
        server.faults.latency = 0.6
        if how == "client-hangs-up":
            hang_up(server.port, "/acct/blob", after_headers=False)  # gone at 0.1 s
        else:
            def get_cut() -> None:
                with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
                    _status_of_next_get(server)  # its connection is closed

            t = threading.Thread(target=get_cut, daemon=True)
            t.start()
            time.sleep(0.2)
            server.cancel_requests()
            t.join(10)
        time.sleep(0.9)  # past the latency
        assert server.faults.status_script == [503]
        server.faults.latency = 0
        assert _status_of_next_get(server) == 503
        assert _status_of_next_get(server) == 200
