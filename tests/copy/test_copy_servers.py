"""Whether two names reach one server (:mod:`tensorstream.copy.servers`), as ``cp``/
``sync`` decide one store by it (``tests/cli/test_cli_one_store.py`` runs the CLI)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from tensorstream.copy import servers
from tensorstream.copy.places import same_store
from tensorstream.uri import parse_uri

ONE = [
    ("redis://127.0.0.1:6379/k", "redis://localhost:6379/k"),
    ("redis://localhost/k", "redis://127.0.0.1:6379/k"),  # the default port
    ("redis://LOCALHOST./k", "redis://localhost:6379/k"),
    ("redis://[::1]:6379/k", "redis://[0:0::1]/k"),
    ("redis://[::ffff:127.0.0.1]:6379/k", "redis://127.0.0.1/k?db=0"),
    ("rediss://localhost:6380/k", "rediss://127.0.0.1:6380/k"),
    ("http://127.0.0.1/a", "HTTP://LOCALHOST:80/b"),
    ("https://Example.COM./a", "https://example.com:443/a"),  # no resolving needed
]
TWO = [
    ("redis://localhost:6379/k", "redis://localhost:6380/k"),
    ("redis://127.0.0.1:6379/k", "redis://[::1]:6379/k"),  # may be two processes
    ("redis://localhost/k", "rediss://localhost/k"),
    ("redis://localhost/k", "redis://127.0.0.1/k?db=2"),
    ("http://localhost/a", "https://localhost:80/a"),
    ("http://127.0.0.1:8080/a", "http://localhost:8081/a"),
    ("redis://no-such-host.invalid/k", "redis://127.0.0.1/k"),  # resolves to nothing
]


@pytest.mark.parametrize(("a", "b"), ONE + [(b, a) for a, b in ONE])
def test_one_server_under_two_names_is_one_store(a: str, b: str) -> None:
    assert same_store(parse_uri(a), parse_uri(b), {}, {})


@pytest.mark.parametrize(("a", "b"), TWO + [(b, a) for a, b in TWO])
def test_two_servers_are_two_stores(a: str, b: str) -> None:
    assert not same_store(parse_uri(a), parse_uri(b), {}, {})


@pytest.mark.parametrize(("here", "there", "same"), [
    ("http://127.0.0.1:9000", "http://localhost:9000/", True),
    ("http://127.0.0.1:9000", "HTTP://LOCALHOST.:9000", True),
    ("localhost:443", "https://127.0.0.1", True),  # no scheme: https
    ("https://minio.example.com", "https://MINIO.example.com:443/", True),
    ("http://127.0.0.1:9000", "http://localhost:9001", False),
    ("http://localhost:9000", "https://localhost:9000", False),
    ("http://localhost:9000/a", "http://localhost:9000/b", False),
])
def test_s3_endpoints_written_two_ways(here: str, there: str, same: bool) -> None:
    s3 = parse_uri("s3://b/p/")
    keys = {"s3_access_key_id": "AKIDEXAMPLE", "s3_secret_access_key": "x"}
    assert same_store(s3, s3, {**keys, "s3_endpoint": here},
                      {**keys, "s3_endpoint": there}) is same


def test_two_names_of_one_address_over_http_are_two_servers_unless_loopback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sites and S3 accounts share addresses and are told apart by name (virtual hosts,
    SNI): two names over HTTP(S) are one server only on this machine. Plain Redis has no
    names to tell apart: one address is one server."""
    monkeypatch.setattr(servers, "_RESOLVED", {
        "a.example": frozenset({servers._literal("192.0.2.7")}),
        "b.example": frozenset({servers._literal("192.0.2.7")}),
        "dev": frozenset({servers._literal("127.0.0.1")}),
    })
    assert not same_store(parse_uri("https://a.example/m"), parse_uri("https://b.example/m"),
                          {}, {})
    assert same_store(parse_uri("redis://a.example/m"), parse_uri("redis://b.example/m"), {}, {})
    assert same_store(parse_uri("https://a.example/m"), parse_uri("https://192.0.2.7/m"), {}, {})
    assert same_store(parse_uri("http://dev:9000/m"), parse_uri("http://localhost:9000/m"),
                      {}, {})


def test_each_host_name_is_resolved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "_RESOLVED", {})
    calls: list[Any] = []
    real = socket.getaddrinfo

    def counted(host: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counted)
    for _ in range(3):
        assert same_store(parse_uri("redis://127.0.0.1/k"), parse_uri("redis://localhost/k"),
                          {}, {})
        assert same_store(parse_uri("redis://LOCALHOST/k"), parse_uri("redis://127.0.0.1/j"),
                          {}, {})
    assert calls == ["localhost"]


def test_a_resolver_that_hangs_is_waited_for_a_bounded_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo has no timeout: a hung resolver held the copy; now the name is another
    server after :data:`RESOLVE_TIMEOUT` (the copy goes on), and is not asked again."""
    monkeypatch.setattr(servers, "_RESOLVED", {})
    monkeypatch.setattr(servers, "RESOLVE_TIMEOUT", 0.3)
    release = threading.Event()
    calls: list[Any] = []

    def hung(host: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(host)
        release.wait(30)
        raise socket.gaierror("gave up")

    monkeypatch.setattr(socket, "getaddrinfo", hung)
    try:
        start = time.monotonic()
        for _ in range(3):
            assert not same_store(parse_uri("redis://slow.example/k"),
                                  parse_uri("redis://127.0.0.1/k"), {}, {})
        assert time.monotonic() - start < 2
        assert calls == ["slow.example"]
    finally:
        release.set()
