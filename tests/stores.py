"""Where the load, convert and copy tests put their objects: a ``Store`` of each kind (a local
directory, the in-memory ``memtest://`` provider, HTTP, S3 on moto, Redis), under a prefix of
its own. ``put`` writes with the server's own client, around tensorstream; ``get`` reads back
the same way, except Redis, read through tensorstream (its writes there are chunked)."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from memory_provider import MemProvider

tensorstream.register("memtest", MemProvider, replace=True)


@dataclasses.dataclass
class Store:
    """Objects under ``uri(key)`` (opened with ``options``): ``put(key, bytes)`` stores one,
    ``get(key)`` reads it back (``KeyError`` or ``FileNotFoundError`` when it is not there)."""

    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def exists(self, key: str) -> bool:
        try:
            self.get(key)
        except (KeyError, FileNotFoundError):
            return False
        return True


def local_store(root: Path) -> Store:
    """Files under the directory ``root`` (made if missing)."""
    root.mkdir(parents=True, exist_ok=True)

    def put(key: str, data: bytes) -> None:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)

    return Store("local", lambda k: str(root / k), put, lambda k: (root / k).read_bytes())


def mem_store() -> Store:
    """Objects of ``memtest://`` in a bucket of their own."""
    bucket = "b" + secrets.token_hex(4)

    def put(key: str, data: bytes) -> None:
        MemProvider.store[f"{bucket}/{key}"] = data

    def get(key: str) -> bytes:
        return MemProvider.store[f"{bucket}/{key}"]

    return Store("mem", lambda k: f"memtest://{bucket}/{k}", put, get)


def make_store(name: str, request: pytest.FixtureRequest, root: Path) -> Store:
    """A ``name`` store ("local", "mem", "http", "s3" or "redis"); a local one in ``root``,
    a server's under a fresh prefix (the server's fixture is started on first use)."""
    if name == "local":
        return local_store(root)
    if name == "mem":
        return mem_store()
    prefix = f"t{secrets.token_hex(4)}"
    if name == "http":
        server = request.getfixturevalue("http_server")
        request.getfixturevalue("http_reset")
        return Store(name, lambda k: server.url(f"{prefix}/{k}"),
                     lambda k, d: server.put(f"{prefix}/{k}", d),
                     lambda k: server.get(f"{prefix}/{k}"), dict(server.options))
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")

        def s3get(k: str) -> bytes:
            if not s3.exists(S3_BUCKET, f"{prefix}/{k}"):
                raise FileNotFoundError(k)
            return s3.get(S3_BUCKET, f"{prefix}/{k}")

        return Store(name, lambda k: f"s3://{S3_BUCKET}/{prefix}/{k}",
                     lambda k, d: s3.put(S3_BUCKET, f"{prefix}/{k}", d), s3get, s3.options())
    if name == "redis":
        server = request.getfixturevalue("redis_server")

        def rget(k: str) -> bytes:
            with tensorstream.open(server.url(f"{prefix}/{k}")) as f:
                return bytes(f.read())

        return Store(name, lambda k: server.url(f"{prefix}/{k}"),
                     lambda k, d: server.put(f"{prefix}/{k}", d), rget)
    raise AssertionError(name)
