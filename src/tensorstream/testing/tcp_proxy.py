"""A fault-injecting TCP proxy for tests (Redis, or any other TCP service).

It runs in its **own thread and event loop** on ``127.0.0.1`` and a free port,
so the code under test may use tensorstream's sync or async API::

    with TCPFaultProxy("127.0.0.1", redis_port) as proxy:
        proxy.faults.drop_after = 1 << 20        # cut each connection after 1 MiB downstream
        proxy.faults.use_rst = True              # ... with a TCP reset instead of a FIN
        client = redis.Redis(port=proxy.port)

Faults are plain attributes of :class:`TCPFaults` (set them before the client
runs); ``faults.reset()`` restores a transparent proxy. Its counters tell a test
what happened (connections, drops, refusals, bytes each way).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from .fault_settings import _CHUNK, KnownFields, _chunk_for, _reset_fields, _run_hook
from .in_flight import InFlight
from .loop_thread import _StreamServer

__all__ = ["TCPFaultProxy", "TCPFaults"]

#: ``hook(data)`` run before client bytes are forwarded upstream (TCP proxy).
DataHook = Callable[[bytes], Awaitable[None]]


@dataclasses.dataclass
class TCPFaults(KnownFields):
    """What :class:`TCPFaultProxy` does to traffic. Downstream = upstream -> client."""

    fixture: ClassVar[str] = "tensorstream_redis"

    #: Seconds to wait before forwarding each burst of client bytes (adds per-request latency).
    latency: float = 0.0
    #: Downstream bytes per second, per connection.
    rate_limit: int | None = None
    #: Cut a connection once this many downstream bytes went through it ...
    drop_after: int | None = None
    #: ... on this many connections (``None``: every connection).
    drop_times: int | None = None
    #: Cut with a TCP reset (RST) instead of an orderly close (FIN).
    use_rst: bool = False
    #: Reset this many new connections as soon as they are accepted.
    refuse: int = 0
    #: Hold downstream bytes (the connection stays open but silent) while true.
    stall: bool = False
    #: Called with each burst of client bytes before it is forwarded. Raising
    #: ``ConnectionError`` cuts the connection (the burst is not forwarded); any other
    #: exception is a failed hook, kept in ``hook_errors``.
    on_client_data: DataHook | None = None

    # counters (managed by the proxy)
    connections: int = 0
    dropped: int = 0
    refused: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    #: What ``on_client_data`` raised other than ``ConnectionError`` (the pytest
    #: plugin fails the test with them at its teardown).
    hook_errors: list[BaseException] = dataclasses.field(default_factory=list)
    #: Which setting of ``drop_after`` is in force (changed by each assignment).
    _drop_epoch: ClassVar[int] = 0

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "drop_after":
            # Each setting of drop_after is a new fault: connections count their bytes
            # from here (see TCPFaultProxy._pump_down).
            object.__setattr__(self, "_drop_epoch", next(_drop_epochs))

    def reset(self) -> None:
        """Back to a transparent proxy, counters at zero."""
        _reset_fields(self)

    def _drop_left(self, count: int) -> int | None:
        """Bytes a connection that has sent ``count`` since the fault may still send
        before it is cut, or ``None`` when no cut applies."""
        if self.drop_after is None or (self.drop_times is not None
                                       and self.dropped >= self.drop_times):
            return None
        return self.drop_after - count


_drop_epochs = itertools.count()


def _abort(writer: asyncio.StreamWriter, rst: bool) -> None:
    sock = writer.get_extra_info("socket")
    if rst and sock is not None:
        try:  # SO_LINGER with a zero timeout turns close() into a reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    if rst:
        writer.transport.abort()
    else:
        writer.close()


class TCPFaultProxy(_StreamServer):
    """A TCP proxy on ``127.0.0.1`` (free port) to ``host:port`` that can delay,
    cap, stall, cut or reset connections (see :class:`TCPFaults`)."""

    _thread_name = "tensorstream-tcp-proxy"

    def __init__(self, host: str, port: int, *, listen_port: int = 0) -> None:
        super().__init__(port=listen_port)
        self.upstream = (host, port)
        self.faults = TCPFaults()
        self._in_flight = InFlight()

    def __repr__(self) -> str:
        return f"TCPFaultProxy(127.0.0.1:{self.port} -> {self.upstream[0]}:{self.upstream[1]})"

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        _abort(writer, rst=True)

    def cancel_requests(self) -> None:
        """Cut the connections whose client bytes are held back now (under ``latency``
        or in a hook), so they never reach the server: the plugin does so when a test
        ends (a client that gave up had its command run during the next test)."""
        self._in_flight.cancel()

    def cut_all(self, *, rst: bool = True) -> None:
        """Cut every open connection now (a reset by default)."""
        loop = self._lt.loop
        if loop is None:
            return

        async def cut() -> None:
            for w in list(self._writers):
                _abort(w, rst)

        asyncio.run_coroutine_threadsafe(cut(), loop).result(10)

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        f = self.faults
        f.connections += 1
        if f.refuse > 0:
            f.refuse -= 1
            f.refused += 1
            _abort(cwriter, rst=True)
            return
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(cwriter, rst=True)
            return
        self._writers.add(uwriter)
        up = asyncio.ensure_future(self._pump_up(creader, uwriter))
        down = asyncio.ensure_future(self._pump_down(ureader, cwriter))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            cut = down.done() and not down.cancelled() and down.exception() is None and down.result()
            _abort(cwriter, rst=bool(cut) and self.faults.use_rst)
            _abort(uwriter, rst=False)
            self._writers.discard(uwriter)

    async def _pump_up(self, creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter) -> None:
        while data := await creader.read(_CHUNK):
            f = self.faults
            with self._in_flight.track():  # held back: cancel_requests() cuts the connection
                if f.on_client_data is not None:
                    await _run_hook(f.hook_errors, f.on_client_data(data))
                if f.latency:
                    await asyncio.sleep(f.latency)
            f.bytes_up += len(data)
            uwriter.write(data)
            await uwriter.drain()

    async def _pump_down(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> bool:
        """Forward upstream bytes; True when the connection was cut on purpose."""
        # drop_after counts the bytes sent since it was set: a connection older than
        # the fault (a client's pooled one) counted its earlier answers too and was cut
        # at once, or after whatever read was under way, not after drop_after bytes.
        f = self.faults
        sent, epoch = 0, f._drop_epoch

        def left() -> int | None:
            nonlocal sent, epoch
            if self.faults._drop_epoch != epoch:
                sent, epoch = 0, self.faults._drop_epoch
            return self.faults._drop_left(sent)

        while True:
            f = self.faults
            size = _chunk_for(f.rate_limit)
            allowed = left()
            if allowed is not None:
                # At the limit, wait for one byte more: only a connection longer than
                # drop_after is cut and counted (one of exactly that length was cut at
                # once, spending times=1 on it).
                size = max(1, min(size, allowed))
            data = await ureader.read(size)
            if not data:
                return False
            allowed = left()  # the fault may have been set while the read waited
            cut = allowed is not None and len(data) > allowed
            if allowed is not None and cut:
                data = data[:max(0, allowed)]
            while self.faults.stall:
                await asyncio.sleep(0.01)
            cwriter.write(data)
            await cwriter.drain()
            sent += len(data)
            f.bytes_down += len(data)
            if cut:
                f.dropped += 1
                return True
            if f.rate_limit:
                await asyncio.sleep(len(data) / f.rate_limit)
