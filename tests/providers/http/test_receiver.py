"""The shared receiver (one epoll thread receiving many bodies): the Receiver
on its own (socket pairs), and the blocking HTTP(S) and S3 data plane's tests
run again with every body received by it."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import test_blocking_http as blocking

from tensorstream.providers._http import receiver as receiver_mod
from tensorstream.providers._http.receiver import ReceiveError, Receiver, shared_receiving
from tensorstream.providers.base import Deadline
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.uri import parse_uri

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receiver_mod, "SHARED_DEFAULT", True)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(5.0)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected TCP pair on loopback (the kernel tunes TCP's buffers, not a
    socketpair's)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    a.settimeout(5.0)
    yield a, b
    a.close()
    b.close()


def _receive_exactly(a: socket.socket, b: socket.socket, n: int) -> None:
    """``n`` random bytes sent from ``b`` arrive whole and exact at ``a`` through a Receiver."""
    body = os.urandom(n)
    sender = threading.Thread(target=b.sendall, args=(body,))
    sender.start()
    view = memoryview(bytearray(n))
    assert Receiver().receive(a, view) == n
    sender.join()
    assert view == body


# -- the Receiver on its own ---------------------------------------------------------------
def test_a_connection_gets_a_receive_window_of_its_own(
        tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    """A body long enough to wake the thread by its low-water mark gives its
    connection a receive buffer of at least WINDOW (the kernel had sized it by
    the bytes per round trip: a few hundred KiB next door, and a paced sender
    stopped for a third of its time); the body is received whole."""
    a, b = tcp_pair
    before = a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    assert before < receiver_mod.WINDOW  # (else this test shows nothing)
    _receive_exactly(a, b, 4 << 20)
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= receiver_mod.WINDOW
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1  # restored


def test_a_buffer_the_caller_sized_is_left_alone(
        tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = tcp_pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 96 << 10)  # (locks the kernel's tuning)
    sized = a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    _receive_exactly(a, b, 2 << 20)
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == sized


def test_fills_the_view_from_many_sockets_at_once() -> None:
    r = Receiver()
    pairs = [socket.socketpair() for _ in range(24)]
    payloads = [bytes([i]) * (300_000 + 1000 * i) for i in range(len(pairs))]
    bufs = [bytearray(len(p)) for p in payloads]
    try:
        for a, _ in pairs:
            a.settimeout(10.0)

        def send(i: int) -> None:
            b = pairs[i][1]
            data = memoryview(payloads[i])
            for off in range(0, len(data), 65536):  # in pieces, interleaved with the others
                b.sendall(data[off : off + 65536])
                time.sleep(0.001)

        senders = [threading.Thread(target=send, args=(i,)) for i in range(len(pairs))]
        for t in senders:
            t.start()
        with ThreadPoolExecutor(len(pairs)) as pool:
            got = list(pool.map(lambda i: r.receive(pairs[i][0], memoryview(bufs[i])),
                                range(len(pairs))))
        for t in senders:
            t.join()
        assert got == [len(p) for p in payloads]
        assert all(bytes(b) == p for b, p in zip(bufs, payloads, strict=True))
        assert r.receives >= len(pairs) and r.wakeups > 0  # its own thread received
        # The socket is handed back as it came: blocking with its timeout, mark 1.
        a = pairs[0][0]
        assert a.gettimeout() == 10.0
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_counts_the_bytes_that_had_arrived_before_they_were_asked_for(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    # cp's width follows the link by this (tensorstream.copy.width): little
    # there before it is asked for, the link is the limit. A connection's
    # first WARM bytes do not count (TCP's window is still growing).
    monkeypatch.setattr(receiver_mod, "WARM", 1000)
    a, b = pair
    r = Receiver()
    b.sendall(b"w" * 1000)
    r.receive(a, memoryview(bytearray(1000)))
    assert (r.asked, r.ready) == (0, 0)
    b.sendall(b"x" * 4000)
    r.receive(a, memoryview(bytearray(4000)))  # all there already
    assert (r.asked, r.ready) == (4000, 4000)
    later = threading.Timer(0.1, b.sendall, args=(b"y" * 4000,))
    later.start()
    r.receive(a, memoryview(bytearray(4000)))  # nothing there: it waited for all of it
    later.join()
    assert (r.asked, r.ready) == (8000, 4000)


def test_peer_closing_early_reports_what_landed(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.sendall(b"x" * 1000)
    b.close()
    buf = bytearray(5000)
    with pytest.raises(ReceiveError) as info:
        Receiver().receive(a, memoryview(buf))
    assert info.value.received == 1000 and isinstance(info.value.error, EOFError)
    assert bytes(buf[:1000]) == b"x" * 1000 and bytes(buf[1000:]) == bytes(4000)


def test_idle_bound_is_the_sockets_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.settimeout(0.3)
    b.sendall(b"y" * 10)
    started = time.monotonic()
    with pytest.raises(ReceiveError) as info:
        Receiver().receive(a, memoryview(bytearray(100)))
    assert 0.25 < time.monotonic() - started < 2.0
    assert info.value.received == 10 and isinstance(info.value.error, TimeoutError)
    assert a.gettimeout() == 0.3


def test_idle_bound_counts_from_the_last_arrival(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.settimeout(0.4)

    def trickle() -> None:  # a byte every 0.1 s: never idle for 0.4 s
        for _ in range(12):
            time.sleep(0.1)
            b.sendall(b"z")

    t = threading.Thread(target=trickle)
    t.start()
    buf = bytearray(12)
    assert Receiver().receive(a, memoryview(buf)) == 12
    t.join()
    assert bytes(buf) == b"z" * 12


def test_total_deadline_cuts_a_trickle(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.05):
            b.sendall(b"t")

    t = threading.Thread(target=trickle)
    t.start()
    deadline = Deadline(time.monotonic() + 0.4, None)
    seen = deadline.last
    started = time.monotonic()
    try:
        with pytest.raises(ReceiveError) as info:
            Receiver().receive(a, memoryview(bytearray(1000)), deadline=deadline)
    finally:
        stop.set()
        t.join()
    assert 0.35 < time.monotonic() - started < 1.5
    assert isinstance(info.value.error, TimeoutError) and info.value.received > 0
    assert deadline.last > seen  # every arrival was reported to the watchdog


def test_shutdown_from_another_thread_ends_the_receive(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    threading.Timer(0.2, a.shutdown, args=(socket.SHUT_RDWR,)).start()
    started = time.monotonic()
    with pytest.raises(ReceiveError):
        Receiver().receive(a, memoryview(bytearray(100)))
    assert time.monotonic() - started < 2.0


def test_nothing_is_written_after_a_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.settimeout(0.2)
    buf = bytearray(100)
    with pytest.raises(ReceiveError):
        Receiver().receive(a, memoryview(buf))
    b.sendall(b"late" * 25)  # arrives after the caller gave up
    time.sleep(0.2)
    assert bytes(buf) == bytes(100)


def test_one_receive_fills_several_views_in_turn(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A body landing in several buffers (tensors back to back) is one transfer:
    each view filled in turn, in order, with no byte lost at the seams."""
    a, b = pair
    data = os.urandom(700_000)
    bufs = [bytearray(n) for n in (100_000, 1, 0, 350_000, 249_999)]

    def send() -> None:
        for off in range(0, len(data), 50_000):
            b.sendall(data[off : off + 50_000])
            time.sleep(0.002)

    t = threading.Thread(target=send)
    t.start()
    r = Receiver()
    assert r.receive(a, [memoryview(x) for x in bufs]) == len(data)
    t.join()
    assert b"".join(bytes(x) for x in bufs) == data


def test_several_views_report_what_landed_from_the_first(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.sendall(b"q" * 1500)
    b.close()
    bufs = [bytearray(1000), bytearray(1000), bytearray(1000)]
    with pytest.raises(ReceiveError) as info:
        Receiver().receive(a, [memoryview(x) for x in bufs])
    assert info.value.received == 1500 and isinstance(info.value.error, EOFError)
    assert bytes(bufs[0]) == b"q" * 1000 and bytes(bufs[1][:500]) == b"q" * 500
    assert bytes(bufs[1][500:]) == bytes(500) and bytes(bufs[2]) == bytes(1000)


def test_only_threads_that_ask_share_it() -> None:
    assert not receiver_mod.shares_receiving()
    with shared_receiving():
        assert receiver_mod.shares_receiving()
        seen = []
        t = threading.Thread(target=lambda: seen.append(receiver_mod.shares_receiving()))
        t.start()
        t.join()
        assert seen == [False]  # a flag of this thread only
    assert not receiver_mod.shares_receiving()


# -- the HTTP data plane on it ------------------------------------------------------------------
def test_ranged_reads_use_it(http_server: HTTPTestServer) -> None:
    key = f"rcv-{uuid.uuid4().hex[:8]}.bin"
    data = bytes(range(256)) * 20_000
    http_server.put(key, data)
    url = http_server.url(key)
    p = blocking._provider(url)
    before = receiver_mod.receiver().receives
    buf = bytearray(3_000_000)
    with shared_receiving():
        p.readinto_blocking(parse_uri(url).path, 1234, memoryview(buf))
    assert bytes(buf) == data[1234 : 1234 + len(buf)]
    assert receiver_mod.receiver().receives > before


def test_a_body_spanning_several_buffers_is_one_hand_off(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``readinto_parts``: one request's body received into several buffers
    (small tensors sharing a request) is handed to the receiver once, not once
    per buffer; the bytes land exact, the rest of the first buffer included."""
    key = f"rcv-{uuid.uuid4().hex[:8]}.bin"
    data = os.urandom(3_000_000)
    http_server.put(key, data)
    http_server.faults.key, http_server.faults.rate_limit = key, 8 << 20  # not all at once
    url = http_server.url(key)
    p = blocking._provider(url)
    calls: list[int] = []
    real = Receiver.receive

    def counted(self: Receiver, sock: socket.socket, view: Any, **kw: Any) -> int:
        calls.append(1)
        return real(self, sock, view, **kw)

    monkeypatch.setattr(Receiver, "receive", counted)
    bufs = [bytearray(n) for n in (700_000, 300_000, 1, 999_999)]
    try:
        with shared_receiving():
            body = p.open_range_blocking(parse_uri(url).path, 1000, 1000 + 2_000_000)
            try:
                assert body.readinto_parts([memoryview(b) for b in bufs]) == 2_000_000
            finally:
                body.close()
    finally:
        http_server.faults.reset()
    assert b"".join(bytes(b) for b in bufs) == data[1000:2_001_000]
    assert len(calls) == 1, calls


def test_tls_bodies(https_server: HTTPTestServer) -> None:
    key = f"rcv-{uuid.uuid4().hex[:8]}.bin"
    data = bytes(range(251)) * 16_000
    https_server.put(key, data)
    url = https_server.url(key)
    p = blocking._provider(url, **https_server.options)
    before = receiver_mod.receiver().receives
    bufs = [bytearray(900_000) for _ in range(4)]

    def one(i: int) -> None:
        with shared_receiving():
            p.readinto_blocking(parse_uri(url).path, i * 900_000, memoryview(bufs[i]))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    assert b"".join(bytes(b) for b in bufs) == data[:3_600_000]
    assert receiver_mod.receiver().receives > before


# The blocking plane's own tests, every body received by the shared receiver
# (the one that breaks http.client's body reader on purpose does not apply).
_RERUN = [
    "test_many_random_ranges_from_many_threads",
    "test_chunked_body_without_content_length",
    "test_wrong_answers_are_protocol_errors",
    "test_ranges_past_the_end",
    "test_pinned_reads",
    "test_cut_body_reports_received_and_is_not_reused",
    "test_idle_timeout_is_a_storage_timeout_and_connection_is_dropped",
    "test_tls_untrusted_refused_ca_bundle_and_insecure_work",
    "test_threads_really_overlap",
]
for _name in _RERUN:
    globals()[f"{_name}_shared"] = pytest.mark.usefixtures("shared")(getattr(blocking, _name))


_NO_EPOLL_CHILD = """
import hashlib, select, sys
del select.epoll  # as on macOS and the BSDs
import tensorstream
from tensorstream.cli.main import main

url, out = sys.argv[1:]
with tensorstream.open(url, stream_reads=False, part_size="1MiB") as f:  # ranged read-ahead
    print(hashlib.sha256(f.read()).hexdigest(), flush=True)
sys.exit(main(["cp", "--no-progress", url, out]))
"""


def test_without_epoll_each_body_is_received_by_its_own_thread(
        http_server: HTTPTestServer, tmp_path: Any) -> None:
    # A platform without epoll (macOS: the README names it) has no shared receiving thread:
    # the read-ahead's and cp's ranged GETs were received by it and failed there with
    # AttributeError; their own threads receive them now, byte for byte.
    import hashlib
    import subprocess
    import sys

    data = os.urandom((9 << 20) + 123)
    key = f"noepoll-{uuid.uuid4().hex}.bin"
    http_server.put(key, data)
    out = tmp_path / "out.bin"
    done = subprocess.run([sys.executable, "-c", _NO_EPOLL_CHILD, http_server.url(key), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert out.read_bytes() == data
