"""The HTTP fault proxy's status script (``tensorstream/testing/http_proxy.py``) in front of
moto's server: which request gets which scripted status."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from tensorstream.testing.http_proxy import HTTPFaultProxy
from tensorstream.testing.s3_server import MotoS3Server


@pytest.fixture
def proxy(moto_s3: MotoS3Server) -> Iterator[HTTPFaultProxy]:
    moto_s3.create_bucket("order")
    moto_s3.put("order", "k", b"abcd")
    with HTTPFaultProxy(moto_s3.endpoint_url) as p:
        yield p


@pytest.fixture
def signed(moto_s3: MotoS3Server, proxy: HTTPFaultProxy) -> Callable[..., bytes]:
    """``signed(method, key, length=0)``: a request's head for ``order/key`` via the proxy,
    SigV4-signed (moto checks signatures; the proxy keeps the Host they cover)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    creds = Credentials(moto_s3.access_key_id, moto_s3.secret_access_key)

    def sign(method: str, key: str, length: int = 0) -> bytes:
        headers = {"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
        if length:
            headers["Content-Length"] = str(length)
        request = AWSRequest(method, f"{proxy.url}/order/{key}", headers=headers)
        SigV4Auth(creds, "s3", moto_s3.region).add_auth(request)
        lines = [f"{method} /order/{key} HTTP/1.1", f"Host: {proxy.url.split('//')[1]}",
                 *(f"{k}: {v}" for k, v in request.headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    return sign


def _status(s: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, "the proxy closed the connection without an answer"
        head += chunk
    return int(head.split(b" ", 2)[1])


def _send(port: int, head: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        return _status(s)


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_scripted_status_goes_to_the_request_that_arrived_first(
        proxy: HTTPFaultProxy, signed: Callable[..., bytes]) -> None:
    """A PUT whose body was still on its way when a GET came and went: the 503 scripted
    for the next request went to the GET (the first whose body was in), not to the PUT
    sent first. Now to the PUT; the GET is forwarded."""
    proxy.faults.status_script = [503]
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as put:
        put.sendall(signed("PUT", "new", 4) + b"ab")
        _wait_for(lambda: not proxy.faults.status_script,
                  "the PUT's headers arrived but it was given no status")
        assert _send(port, signed("GET", "k")) == 200  # forwarded: moto's answer
        put.sendall(b"cd")
        assert _status(put) == 503
    assert proxy.faults.scripted == 1
    assert [(r.method, r.status) for r in proxy.requests] == [("GET", 200), ("PUT", 503)]


def test_sequential_requests_take_the_script_in_order(
        proxy: HTTPFaultProxy, signed: Callable[..., bytes]) -> None:
    """Neighbours: one after another, each takes the next status; a 2xx entry forwards
    its request; past the script every request is forwarded."""
    proxy.faults.status_script = [500, 200, 503]
    port = int(proxy.url.rsplit(":", 1)[1])
    assert [_send(port, signed("GET", "k")) for _ in range(4)] == [500, 200, 503, 200]
    assert proxy.faults.scripted == 2


def test_a_request_outside_path_prefix_takes_no_status(
        proxy: HTTPFaultProxy, signed: Callable[..., bytes]) -> None:
    """A request the faults do not affect leaves the script to the next one that is."""
    proxy.faults.path_prefix = "/order/k"
    proxy.faults.status_script = [503]
    port = int(proxy.url.rsplit(":", 1)[1])
    assert _send(port, signed("GET", "missing")) == 404  # /order/missing: forwarded
    assert proxy.faults.status_script == [503]
    assert _send(port, signed("GET", "k")) == 503


def test_query_limits_the_script_to_requests_naming_that_parameter(
        proxy: HTTPFaultProxy, signed: Callable[..., bytes]) -> None:
    """``faults.query``: only a request whose query names it takes a scripted status
    (``?encryption``: GetBucketEncryption); the others are forwarded and leave the script."""
    proxy.faults.query = "encryption"
    proxy.faults.status_script = [403]
    port = int(proxy.url.rsplit(":", 1)[1])
    assert _send(port, signed("GET", "k")) == 200
    assert proxy.faults.status_script == [403]
    assert _send(port, signed("GET", "k?encryption")) == 403
    assert proxy.faults.scripted == 1
