"""Test helpers that ship with tensorstream: real servers on loopback,
fault injection and the provider conformance suite.

Submodules: ``http_server`` (aiohttp, well-behaved and misbehaving),
``s3_server`` (moto), ``redis_server`` (Debian's redis-server, TLS,
cluster), ``proxy`` (fault-injecting proxies: ``tcp_proxy``, ``http_proxy``),
``forward_proxy`` (a CONNECT/forwarding HTTP proxy),
``conformance`` (one suite for every provider), ``plugin`` (the pytest plugin).
"""
