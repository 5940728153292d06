"""Fault-injecting proxies for tests: one for raw TCP, one that understands HTTP.

Both run in their **own thread and event loop** on ``127.0.0.1`` and a free
port, so the code under test may use tensorstream's sync or async API::

    with TCPFaultProxy("127.0.0.1", redis_port) as proxy:
        proxy.faults.drop_after = 1 << 20        # cut each connection after 1 MiB downstream
        proxy.faults.use_rst = True              # ... with a TCP reset instead of a FIN
        client = redis.Redis(port=proxy.port)

    with HTTPFaultProxy("http://127.0.0.1:9000") as proxy:   # e.g. in front of moto
        proxy.faults.status_script = [503, 503]  # the next two requests fail
        proxy.faults.ignore_range = True         # strip Range: the upstream answers 200
        assert proxy.requests[-1].status == 503

Faults are plain attributes (set them before the client runs); ``faults.reset()``
restores a transparent proxy. Counters on the faults object tell a test what
happened (connections, drops, scripted answers).

The TCP proxy lives in :mod:`.tcp_proxy`, the HTTP one in :mod:`.http_proxy`;
this module names both, as it always has.
"""

from __future__ import annotations

from .http_proxy import HTTPFaultProxy, HTTPProxyFaults, ProxyRequest
from .tcp_proxy import TCPFaultProxy, TCPFaults

__all__ = ["HTTPFaultProxy", "HTTPProxyFaults", "ProxyRequest", "TCPFaultProxy", "TCPFaults"]
