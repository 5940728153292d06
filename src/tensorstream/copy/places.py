"""Whether the two sides of a copy are one store.

``--src-*``/``--dst-*`` options (``src_options``/``dst_options``) let each side
have its own endpoint and credentials, but most of them name no other store: a
profile per side (a read-only and a read-write key of one account), a region, a
CA bundle, a password, or the very endpoint the other side uses. Taken for two
stores, ``cp s3://b/k s3://b/k`` rewrote the object from itself and ``sync
--delete`` of a prefix into the prefix above it deleted the source. What places
an object is its scheme, its host or bucket, and for S3 the endpoint the options
resolve to (a profile's ``endpoint_url`` and the environment included).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import TensorstreamError
from ..uri import ParsedURI

__all__ = ["connection", "same_store"]

#: Schemes whose URI's host and port name the server (options only say how to reach it).
_HOSTED = frozenset({"redis", "rediss", "http", "https"})
_REDIS = frozenset({"redis", "rediss"})


def connection(uri: ParsedURI) -> tuple[Any, ...]:
    """What of ``uri`` configures the provider made from it: the host, the user and
    password of its userinfo and, for Redis, its query (``?db=2``, ``?cluster=``).
    Sources sharing one provider by host alone were read from the first one's
    database with the first one's user (``redis://h/b?db=2`` copied database 1's ``b``)."""
    query = tuple(sorted(uri.query.items())) if uri.scheme in _REDIS else ()
    return (uri.scheme, uri.netloc, uri.username, uri.password, query)


def same_store(src: ParsedURI, dst: ParsedURI, src_options: Mapping[str, Any],
               dst_options: Mapping[str, Any]) -> bool:
    """Whether ``src`` and ``dst`` (with each side's whole options) are on one store."""
    if (src.scheme, src.netloc) != (dst.scheme, dst.netloc):
        return False
    if src.scheme in _REDIS and _redis_db(src, src_options) != _redis_db(dst, dst_options):
        return False  # one server, two databases
    if src.scheme == "file" or src_options == dst_options or src.scheme in _HOSTED:
        return True
    if src.scheme in ("s3", "s3a"):
        return _s3_endpoint(src_options) == _s3_endpoint(dst_options)
    return False  # another fsspec store: its options may well name another one


def _s3_endpoint(options: Mapping[str, Any]) -> str | TensorstreamError | None:
    """The endpoint an S3 provider made from ``options`` would send requests to (None:
    AWS, where a bucket's name is global); a configuration error is no endpoint, and
    never equal to another (the copy reports it)."""
    from ..providers.s3.config import normalize_endpoint, resolve_s3_credentials

    try:
        endpoint = resolve_s3_credentials(options).endpoint
    except TensorstreamError as exc:
        return exc
    return None if endpoint is None else _server(normalize_endpoint(endpoint.value))


#: The port a URL without one reaches.
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _server(url: str) -> str:
    """``url`` as one spelling of its server: host names are case-insensitive and a
    scheme's default port may be written or not (``https://MinIO.example`` and
    ``https://minio.example:443/`` were two stores: ``sync --delete`` of a prefix
    into the one above deleted its own source)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # (refused where the provider is made)
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def _redis_db(uri: ParsedURI, options: Mapping[str, Any]) -> str:
    """The database a Redis URI with ``options`` names (the option over the URI's query)."""
    db = options.get("redis_db")
    return str(uri.query.get("db", 0) if db is None else db).lstrip("0") or "0"
