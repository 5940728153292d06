"""tensorstream.testing.proxy on its own: the TCP proxy (delay, cap, stall, cut,
reset, refuse) and the HTTP proxy (status script, ignored Range, cut body)."""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from client_hang_up import hang_up, warnings_logged

import tensorstream
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.proxy import HTTPFaultProxy, TCPFaultProxy


class _Blob(socketserver.BaseRequestHandler):
    """Reads a line ``N\\n`` and answers N bytes, then waits for the next line."""

    def handle(self) -> None:
        f = self.request.makefile("rb")
        for line in f:
            n = int(line)
            self.request.sendall(bytes(i % 251 for i in range(n)))


@pytest.fixture(scope="module")
def blob_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Blob)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def tcp(blob_server: int) -> Iterator[TCPFaultProxy]:
    with TCPFaultProxy("127.0.0.1", blob_server) as proxy:
        yield proxy


def ask(port: int, n: int, *, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"%d\n" % n)
        got = bytearray()
        while len(got) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return bytes(got)


def expected(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


def test_tcp_transparent(tcp):
    assert ask(tcp.port, 300_000) == expected(300_000)
    assert tcp.faults.connections == 1 and tcp.faults.bytes_down == 300_000


def test_tcp_latency(tcp):
    tcp.faults.latency = 0.3
    t0 = time.monotonic()
    assert ask(tcp.port, 10) == expected(10)
    assert time.monotonic() - t0 >= 0.3


def test_tcp_rate_limit(tcp):
    tcp.faults.rate_limit = 200_000
    t0 = time.monotonic()
    assert ask(tcp.port, 100_000) == expected(100_000)
    assert time.monotonic() - t0 >= 0.45


def test_tcp_drop_after_closes_with_fin(tcp):
    tcp.faults.drop_after = 1000
    tcp.faults.drop_times = 1
    assert ask(tcp.port, 50_000) == expected(1000)  # clean EOF after exactly 1000 bytes
    assert ask(tcp.port, 50_000) == expected(50_000)  # only once
    assert tcp.faults.dropped == 1


def test_tcp_drop_after_counts_from_when_it_was_set(tcp):
    # A connection older than the fault (a loader's pooled one, warmed earlier in the
    # test or by an earlier test) counted its earlier bytes: it was cut at once, or
    # after whatever read was under way (64 KiB here), never after drop_after bytes.
    with socket.create_connection(("127.0.0.1", tcp.port), timeout=10) as s:
        def answer(n: int) -> bytes:
            s.sendall(b"%d\n" % n)
            got = bytearray()
            while len(got) < n and (chunk := s.recv(65536)):
                got += chunk
            return bytes(got)

        assert answer(300_000) == expected(300_000)
        tcp.faults.drop_after, tcp.faults.drop_times = 100_000, 1
        assert answer(300_000) == expected(100_000)
    assert tcp.faults.dropped == 1
    assert ask(tcp.port, 300_000) == expected(300_000)  # times=1: the next one is whole


def test_tcp_an_answer_of_exactly_drop_after_bytes_is_not_cut(tcp):
    # docs/testing.md: only a connection longer than drop_after is cut and counted.
    # One that had sent exactly drop_after bytes was cut (and counted) at once, so
    # times=1 was spent on it and the long answer after it went through whole.
    tcp.faults.drop_after, tcp.faults.drop_times = 1000, 1
    assert ask(tcp.port, 1000) == expected(1000)
    assert ask(tcp.port, 50_000) == expected(1000)
    assert tcp.faults.dropped == 1


def test_tcp_drop_with_reset(tcp):
    tcp.faults.drop_after = 1000
    tcp.faults.use_rst = True
    with pytest.raises(ConnectionResetError):
        with socket.create_connection(("127.0.0.1", tcp.port), timeout=10) as s:
            s.sendall(b"50000\n")
            time.sleep(0.2)
            while s.recv(65536):
                pass


def test_tcp_refuse_then_serve(tcp):
    tcp.faults.refuse = 1
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        with socket.create_connection(("127.0.0.1", tcp.port), timeout=10) as s:
            time.sleep(0.2)
            s.sendall(b"10\n")
            if not s.recv(10):
                raise ConnectionResetError("closed")
    assert ask(tcp.port, 10) == expected(10)
    assert tcp.faults.refused == 1


def test_tcp_stall_and_cut_all(tcp):
    tcp.faults.stall = True
    with socket.create_connection(("127.0.0.1", tcp.port), timeout=0.5) as s:
        s.sendall(b"10\n")
        with pytest.raises(socket.timeout):
            s.recv(10)
        tcp.cut_all()
        s.settimeout(5)
        with pytest.raises((ConnectionResetError, OSError)):
            if not s.recv(10):
                raise ConnectionResetError("closed")
    tcp.faults.reset()
    assert ask(tcp.port, 10) == expected(10)


# ---------------------------------------------------------------- HTTP proxy
@pytest.fixture(scope="module")
def origin() -> Iterator[HTTPTestServer]:
    with HTTPTestServer() as server:
        server.put("obj", expected(200_000))
        yield server


@pytest.fixture
def hproxy(origin) -> Iterator[HTTPFaultProxy]:
    with HTTPFaultProxy(origin.base_url) as proxy:
        yield proxy


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.headers, resp.read()


def test_http_proxy_forwards_ranges(hproxy):
    status, headers, body = get(hproxy.url + "/obj", {"Range": "bytes=10-19"})
    assert status == 206 and body == expected(200_000)[10:20]
    assert headers["Content-Range"] == "bytes 10-19/200000" and headers["ETag"]


def test_http_proxy_status_script(hproxy):
    hproxy.faults.status_script = [503, 500]
    hproxy.faults.retry_after = 1
    for want, code in ((503, b"SlowDown"), (500, b"InternalError")):
        with pytest.raises(urllib.error.HTTPError) as info:
            get(hproxy.url + "/obj")
        assert info.value.code == want and code in info.value.read()
        assert info.value.headers["Retry-After"] == "1"
    assert get(hproxy.url + "/obj")[0] == 200
    assert [r.status for r in hproxy.requests] == [503, 500, 200]


def test_http_proxy_ignore_range(hproxy):
    hproxy.faults.ignore_range = True
    status, _, body = get(hproxy.url + "/obj", {"Range": "bytes=10-19"})
    assert status == 200 and len(body) == 200_000


def test_http_proxy_drop_after(hproxy):
    hproxy.faults.drop_after = 5000
    with pytest.raises(http.client.IncompleteRead) as info:
        get(hproxy.url + "/obj")
    assert len(info.value.partial) == 5000
    assert hproxy.faults.dropped == 1


def test_http_proxy_rate_limit_and_latency(hproxy):
    hproxy.faults.rate_limit = 400_000
    hproxy.faults.latency = 0.2
    t0 = time.monotonic()
    assert get(hproxy.url + "/obj")[2] == expected(200_000)
    assert time.monotonic() - t0 >= 0.65


def test_http_proxy_path_prefix_limits_faults(hproxy, origin):
    origin.put("other", b"x")
    hproxy.faults.path_prefix = "/obj"
    hproxy.faults.status_script = [503]
    assert get(hproxy.url + "/other")[2] == b"x"
    assert hproxy.faults.status_script == [503]


class _Chunked(BaseHTTPRequestHandler):
    """Answers ``/N`` with N bytes in a chunked body (no Content-Length)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        n = int(self.path.strip("/"))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = expected(n)
        for i in range(0, n, 4096):
            piece = body[i:i + 4096]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def chunked_origin() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chunked)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_proxy_drop_after_cuts_a_chunked_body(chunked_origin: str) -> None:
    # A body without Content-Length was never cut: the fault was set, the test passed
    # its bytes whole, and nothing said the fault had not happened.
    with HTTPFaultProxy(chunked_origin) as proxy:
        proxy.faults.drop_after, proxy.faults.drop_times = 5000, 1
        with pytest.raises(http.client.IncompleteRead) as info:
            get(proxy.url + "/20000")
        assert len(info.value.partial) == 5000
        assert proxy.faults.dropped == 1
        assert get(proxy.url + "/20000")[2] == expected(20000)  # times=1: once


@pytest.mark.parametrize("n", [0, 4999, 5000])
def test_http_proxy_a_chunked_body_within_drop_after_is_whole_and_not_counted(
        chunked_origin: str, n: int) -> None:
    with HTTPFaultProxy(chunked_origin) as proxy:
        proxy.faults.drop_after, proxy.faults.drop_times = 5000, 1
        assert get(proxy.url + f"/{n}")[2] == expected(n)
        assert proxy.faults.dropped == 0
        with pytest.raises(http.client.IncompleteRead):  # the one cut is still there
            get(proxy.url + "/5001")
        assert proxy.faults.dropped == 1


def test_a_proxy_whose_start_hangs_raises_instead_of_serving_port_0() -> None:
    from tensorstream.testing.loop_thread import _LoopThread

    async def never() -> None:
        await asyncio.sleep(3600)

    lt = _LoopThread("hanging-proxy")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not start within 0\.2 s"):
        lt.start(never, timeout=0.2)
    assert time.monotonic() - t0 < 5
    assert lt.loop is None and not any(t.name == "hanging-proxy" for t in threading.enumerate())


@pytest.mark.parametrize("when", ["mid-body", "mid-body-rst", "before-headers"])
def test_http_proxy_a_client_hanging_up_is_counted_not_logged(
        hproxy: HTTPFaultProxy, caplog: pytest.LogCaptureFixture, when: str) -> None:
    # A client that has seen enough (a loader that refused a header, a test's timeout)
    # hangs up mid-answer; the proxy's next write failed and aiohttp logged "Error
    # handling request" with a ClientConnectionResetError traceback, as if the proxy
    # had failed.
    if when == "before-headers":
        hproxy.faults.latency = 0.5  # the client is gone before the answer starts
    else:
        hproxy.faults.rate_limit = 100_000  # 200 KB over ~2 s: the body is still going
    hang_up(hproxy.port, "/obj", after_headers=when != "before-headers",
            reset=when == "mid-body-rst")
    deadline = time.monotonic() + 10
    while hproxy.hung_up < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert warnings_logged(caplog) == []
    assert hproxy.hung_up == 1
    # The proxy serves the next client as before, and a whole answer is no hang-up.
    hproxy.faults.reset()
    assert get(hproxy.url + "/obj")[2] == expected(200_000)
    assert hproxy.hung_up == 1


def test_http_proxy_a_hook_raising_connection_error_hangs_up_quietly(
        hproxy: HTTPFaultProxy, caplog: pytest.LogCaptureFixture) -> None:
    """A ``before_forward`` hook raising ``ConnectionError`` asks for a hang-up: the client
    saw its connection cut, but aiohttp logged "Error handling request" with the
    ConnectionError's traceback at ERROR, as if the proxy had failed. Quiet now, as the
    proxy's other hang-ups are; it is no hook error, and the next request is served."""
    calls: list[str] = []

    async def hang_up_once(method: str, path: str) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise ConnectionResetError("the test asked for a hang-up")

    hproxy.faults.before_forward = hang_up_once
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        get(hproxy.url + "/obj")
    time.sleep(0.2)  # (aiohttp logs once the handler has ended)
    assert warnings_logged(caplog) == []
    assert hproxy.faults.hook_errors == []
    assert get(hproxy.url + "/obj")[2] == expected(200_000)
    assert calls == ["/obj", "/obj"]


@pytest.mark.parametrize("cuts", [1, 2])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_s3_requests_whose_connection_the_hook_cuts_are_sent_again_and_land_once(
        tensorstream_s3: Any, caplog: pytest.LogCaptureFixture, method: str,
        cuts: int) -> None:
    """The neighbours, through moto: a read (GetObject), a whole object's write (PutObject)
    and a delete (DeleteObject) whose first connections are cut by the hook. One cut is
    sent again by aiohttp itself (an idempotent request, RFC 9112 9.3.1.1); two reach
    tensorstream's retry (a PutObject too: the object is looked at, holds the old bytes,
    and the write is sent again). The bytes read or stored are exact, the delete is done,
    and neither the proxy nor tensorstream logs an error."""
    b = tensorstream_s3
    data = bytes(range(256)) * 4096  # 1 MiB: one request
    b.put("k.bin", data)
    calls: list[str] = []

    async def cut_the_first(m: str, path: str) -> None:
        if m == method and path.endswith("/k.bin"):
            calls.append(m)
            if len(calls) <= cuts:
                raise ConnectionResetError("cut by the test")

    b.faults.raw.before_forward = cut_the_first

    async def run() -> bytes | None:
        async with tensorstream.get_provider(b.uri("k.bin"), **b.options) as p:
            path = b.uri("k.bin").removeprefix("s3://")
            if method == "GET":
                return await p.read_range(path, 0, len(data))
            if method == "DELETE":
                await p.delete(path)
            return None

    if method == "PUT":
        with tensorstream.open(b.uri("k.bin"), "wb", **b.options) as w:
            w.write(data[::-1])
    got = asyncio.run(run())
    time.sleep(0.2)  # (aiohttp logs once the handler has ended)
    assert len(calls) == cuts + 1, calls
    assert b.faults.raw.hook_errors == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    if method == "GET":
        assert got == data
    elif method == "PUT":
        assert b.get("k.bin") == data[::-1]
    else:
        with pytest.raises(KeyError):
            b.get("k.bin")
