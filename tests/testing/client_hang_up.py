"""A client that hangs up on a test server mid-answer, and what the server logged."""

from __future__ import annotations

import logging
import socket
import struct
import time

import pytest


def hang_up(port: int, path: str, *, after_headers: bool = True, reset: bool = False) -> None:
    """GET ``path`` from ``127.0.0.1:port`` and hang up: once the answer's headers came
    (``after_headers``), else 0.1 s into waiting for them; ``reset``: with a TCP reset."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        if after_headers:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        else:
            time.sleep(0.1)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged at WARNING or above (aiohttp's "Error handling request"...)."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
