"""Helpers for the reliability suite (``tests/test_reliability_*.py``).

Canary secrets, a listener that never accepts, a child-process runner, an
S3 proxy that answers ``CompleteMultipartUpload`` with ``200`` + ``<Error>``,
and a log handler that runs a callback when the retry layer logs an attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from typing import Any

import psutil

from tensorstream.testing.proxy import HTTPFaultProxy

#: Distinct canaries per channel, so a failure says which channel leaked.
CANARY_ARG = "cnry-arg-7d1f0b2e9a"
CANARY_ENV = "cnry-env-4c8e2a61f3"
CANARY_USERINFO = "cnry-uinfo-91b7d3"
CANARY_FILE = "cnry-file-5e02ac7b44"
CANARY_QUERY = "cnry-query-a6f1c90d"
CANARIES = (CANARY_ARG, CANARY_ENV, CANARY_USERINFO, CANARY_FILE, CANARY_QUERY)

#: Fast retries, small parts: one read becomes several ranged requests.
FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}
SMALL_PARTS = {"part_size": 64 << 10, "min_part_size": 16 << 10, "concurrency": 4,
               "large_read": 16 << 10, **FAST}


def unique(prefix: str = "obj") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def leaked(text: str, canaries: tuple[str, ...] = CANARIES) -> list[str]:
    """The canaries that appear in ``text`` (empty when nothing leaked)."""
    return [c for c in canaries if c in text]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_fds() -> int:
    return int(psutil.Process().num_fds())


class FullBacklogListener:
    """A TCP listener that never accepts and whose accept queue is full, so a new
    connection's SYN is dropped and ``connect()`` hangs until the client's timeout."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = int(self.sock.getsockname()[1])
        self._fillers: list[socket.socket] = []
        # Fill the accept queue (backlog 0 admits one or two) with non-blocking connects.
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(s)

    def close(self) -> None:
        for s in self._fillers:
            s.close()
        self.sock.close()

    def __enter__(self) -> FullBacklogListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_python(code: str, *, timeout: float = 60, env: dict[str, str] | None = None,
               args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (bounded by ``timeout``)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *(args or [])],
                          capture_output=True, text=True, timeout=timeout, env=full_env)


class OnRetryLog(logging.Handler):
    """Calls ``callback(n)`` when ``tensorstream.policy`` logs its n-th failed attempt."""

    def __init__(self, callback: Callable[[int], None]) -> None:
        super().__init__(logging.DEBUG)
        self.callback = callback
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.callback(len(self.records))

    def __enter__(self) -> OnRetryLog:
        logger = logging.getLogger("tensorstream.policy")
        self._old_level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("tensorstream.policy")
        logger.removeHandler(self)
        logger.setLevel(self._old_level)


_ERROR_200 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
              b"<Message>We encountered an internal error. Please try again.</Message></Error>")


class CompleteErrorProxy(HTTPFaultProxy):
    """An S3 proxy that answers every ``CompleteMultipartUpload`` with ``200`` and an
    ``<Error>`` document (without forwarding it), as S3 may do after a long merge."""

    completes = 0

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.method == "POST" and "uploadId=" in request.query_string:
            await request.read()
            self.completes += 1
            self._record(request, 200)
            return web.Response(status=200, body=_ERROR_200,
                                headers={"Content-Type": "application/xml"})
        return await super()._handle(request)
