"""The mocked HTTP backend: a key prefix on a session aiohttp server, with
faults injected by the server itself (see :mod:`tensorstream.testing.backends`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from .backend import Backend, unique_name
from .faults import _HTTPServerFaults

__all__ = ["HTTPBackend"]


class HTTPBackend(Backend):
    """A key prefix on a session aiohttp server (Range, ETag, optional token and TLS)."""

    name = "http"
    kind = "aiohttp"

    def __init__(self, server: Any) -> None:
        self.server = server
        self.prefix = unique_name("t")
        self.ca_bundle = server.ca_bundle_path
        self.token: str | None = server.token
        self._keys: set[str] = set()
        self.faults = _HTTPServerFaults(self)
        self.faults.reset()

    def key(self, key: str) -> str:
        return f"{self.prefix}/{key.lstrip('/')}"

    def uri(self, key: str) -> str:
        # Percent-encoded: a space, '%', '?' or '#' in a key is part of the key,
        # not of the URL's syntax (the server decodes the path back to the key).
        return str(self.server.url(quote(self.key(key), safe="/")))

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.server.options)

    @property
    def env(self) -> dict[str, str]:
        env = {}
        if self.token:
            env["TENSORSTREAM_HTTP_TOKEN"] = self.token
        if self.ca_bundle:
            # OpenSSL's default (urllib, httpx, aiohttp made after it), then requests',
            # which trusts certifi and reads only these two (curl the second).
            for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
                env[name] = self.ca_bundle
        return env

    @property
    def requests(self) -> list[Any]:
        """Requests the server answered (``method``, ``path``, ``headers``, ``status``)."""
        return list(self.server.requests)

    def put(self, key: str, data: bytes) -> None:
        self._keys.add(self.key(key))
        self.server.put(self.key(key), bytes(data))

    def get(self, key: str) -> bytes:
        return bytes(self.server.get(self.key(key)))

    def close(self) -> None:
        self.server.cancel_requests()  # before the reset, as on S3
        super().close()
        self.server.clear_log()
        for k in self._keys:
            self.server.delete(k)
