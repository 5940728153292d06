"""Cutting one step of a Redis write at the TCP fault proxy in front of a server or
a Cluster node: the single-server and the Cluster drop tests share it."""

from __future__ import annotations

from typing import Any

#: What a client burst of each write step holds.
STEPS = {"chunks": b"\r\nSET\r\n", "persist": b"PERSIST", "publish": b"unpack(ARGV"}


class Cut:
    """Cut the connection of the first ``times`` client bursts holding ``marker``
    (an ``on_client_data`` hook of the proxy whose ``TCPFaults`` are ``faults``):
    before the server saw it (``lost``), or once it ran, its answer (``answered``)."""

    def __init__(self, faults: Any, marker: bytes, how: str, times: int = 1) -> None:
        self.faults, self.marker, self.how, self.left = faults, marker, how, times
        self.cut = 0

    async def __call__(self, data: bytes) -> None:
        if self.left <= 0 or self.marker not in data:
            return
        self.left -= 1
        self.cut += 1
        if self.how == "lost":
            raise ConnectionError("cut before the server saw it")
        self.faults.drop_after, self.faults.drop_times = 0, 1  # the next answer down: this one's
