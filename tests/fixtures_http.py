"""Fixtures for the http backend (session-scoped servers on loopback).

* ``http_server`` -- plain HTTP, no auth;
* ``https_server`` -- HTTPS with a throwaway trustme CA (``ca_bundle_path``);
* ``http_token_server`` -- plain HTTP requiring a bearer token;
* ``http_reset`` -- function-scoped: resets faults and request logs of every
  session server above before and after the test.

Tests use unique keys, so the session servers never carry state between tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorstream.testing.http_server import HTTPTestServer

HTTP_TEST_TOKEN = "tok-3f9c2a-canary-never-print"

_servers: list[HTTPTestServer] = []


def _session_server(**kwargs: object) -> Iterator[HTTPTestServer]:
    server = HTTPTestServer(**kwargs).start()  # type: ignore[arg-type]
    _servers.append(server)
    try:
        yield server
    finally:
        _servers.remove(server)
        server.stop()


@pytest.fixture(scope="session")
def http_server() -> Iterator[HTTPTestServer]:
    yield from _session_server()


@pytest.fixture(scope="session")
def https_server() -> Iterator[HTTPTestServer]:
    yield from _session_server(tls=True)


@pytest.fixture(scope="session")
def http_token_server() -> Iterator[HTTPTestServer]:
    yield from _session_server(token=HTTP_TEST_TOKEN)


def _reset_all() -> None:
    for server in list(_servers):
        server.faults.reset()
        server.clear_log()


@pytest.fixture
def http_reset() -> Iterator[None]:
    """Well-behaved servers with empty request logs, before and after the test."""
    _reset_all()
    yield
    _reset_all()


def count_held_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the HTTP body reads served from bytes that had arrived
    (``RangeBody.read_held``: tensor headers, the small-read buffer's fills)."""
    from tensorstream.providers._http.range_get import RangeBody

    served: list[int] = []
    held = RangeBody.read_held

    def counted(self: RangeBody, buffer: memoryview) -> bool:
        ok = held(self, buffer)
        if ok:
            served.append(len(buffer))
        return ok

    monkeypatch.setattr(RangeBody, "read_held", counted)
    return served
