"""The API every mocked backend has (:class:`Backend`), one test's view of a
session server; :mod:`tensorstream.testing.backends` draws it and starts the
servers behind each kind (``s3_backend``, ``http_backend``, ``redis_backend``)."""

from __future__ import annotations

import itertools
import os
import secrets
from typing import Any, ClassVar

from .faults import Faults

__all__ = ["Backend"]

_counter = itertools.count(1)


def unique_name(prefix: str) -> str:
    """``prefix`` made unique in this process and across runs (a bucket, a key prefix)."""
    return f"{prefix}{next(_counter)}-{secrets.token_hex(3)}"


class Backend:
    """One test's view of a mocked backend (see :mod:`tensorstream.testing.backends`)."""

    name: ClassVar[str] = ""
    #: Which server implements it ("moto", "aiohttp", "redis-server", "fakeredis").
    kind: str = ""
    #: CA bundle path to trust (TLS backends), else ``None``.
    ca_bundle: str | None = None
    faults: Faults

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.uri('')!r}>"

    def uri(self, key: str) -> str:
        """The URI of ``key`` on this backend (no secrets in it)."""
        raise NotImplementedError

    @property
    def options(self) -> dict[str, Any]:
        """Storage options to pass to tensorstream calls (a fresh copy)."""
        raise NotImplementedError

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that reach this backend without ``options``: the
        names serving code already reads (``AWS_*``/``S3_*``, ``REDIS_*``,
        ``TENSORSTREAM_HTTP_TOKEN``, ``SSL_CERT_FILE``). A fresh copy."""
        raise NotImplementedError

    def apply_env(self, monkeypatch: Any) -> dict[str, str]:
        """Set :attr:`env` with ``monkeypatch.setenv`` (undone after the test), so an
        unmodified loader that reads the environment reaches this backend. Returns it."""
        env = self.env
        for name, value in env.items():
            if name in _CA_NAMES:
                value = env[name] = _trust_both(os.environ.get(name), value)
            monkeypatch.setenv(name, value)
        return env

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key`` directly (faults do not apply)."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        """The bytes stored at ``key``, read directly (``KeyError`` if absent)."""
        raise NotImplementedError

    def close(self) -> None:
        """Reset faults and remove this test's objects."""
        self.faults.reset()


#: Variables naming a CA bundle: two TLS backends' env in one test must not replace each other's.
_CA_NAMES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
#: CA bundles this process's backends set (and the combinations of them made below).
_TEST_CAS: set[str] = set()


def _trust_both(current: str | None, ca: str) -> str:
    """``ca``, or a bundle of it and ``current`` when ``current`` is another test
    backend's CA set earlier in the test: the second TLS backend's ``env``
    (``tensorstream_redis(tls=True, env=True)`` beside ``tensorstream_http(tls=True,
    env=True)``) replaced the first's CA, whose reads then failed verification."""
    if not current or current == ca or current not in _TEST_CAS:
        _TEST_CAS.add(ca)
        return ca
    import tempfile

    fd, both = tempfile.mkstemp(prefix="ca-", suffix=".pem", dir=os.path.dirname(ca))
    with os.fdopen(fd, "wb") as out:
        for path in (current, ca):
            with open(path, "rb") as pem:
                out.write(pem.read().rstrip(b"\n") + b"\n")
    _TEST_CAS.add(both)
    return both
