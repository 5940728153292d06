"""Signing the S3 provider's reads (GET, HEAD) on the HTTP data plane: object
URLs as botocore addresses them, and SigV4 ``Authorization`` headers reused
per object and method for a while.

The headers are those botocore's ``S3SigV4Auth`` adds to a bodiless request
(:func:`sigv4_headers`, byte for byte: a test compares the two), computed
here because importing ``botocore.auth`` pulls in urllib3, dateutil and
botocore's utilities, a large share of a short ``tensorstream cp``'s start-up
(docs/benchmarks.md, "`cp`: start-up and threads")."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import threading
import time
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

__all__ = ["PathStyle", "SignedGets", "StaticCredentials", "path_style", "sigv4_headers"]

#: SHA-256 of an empty body: what botocore signs as the payload of a GET or HEAD.
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_DEFAULT_PORTS = {"http": 80, "https": 443}

#: Object URLs (and their signatures) remembered.
_URL_CACHE = 4096
#: Seconds one SigV4 signature serves the GETs of one object.
_SIGNATURE_REUSE = 60.0


@dataclasses.dataclass(frozen=True)
class PathStyle:
    """Addressing without a botocore client: path-style URLs under a custom
    endpoint, signed for ``region``.

    Building a botocore client parses S3's service model and endpoint rules
    (~0.1 s of CPU); a read-only copy from an S3-compatible server with
    static keys needs neither, and ``tensorstream cp`` pays that on every run.
    Used only where the URL is fully determined (see :func:`path_style`); a
    test checks it against botocore's ``generate_presigned_url``."""

    endpoint: str
    region: str

    def url(self, bucket: str, key: str) -> str:
        # botocore renders {Bucket}/{Key+} with percent-encoding that keeps "/" and "~".
        return f"{self.endpoint}/{quote(bucket, safe='')}/{quote(key, safe='/~')}"


def path_style(endpoint: str | None, style: str | None, region: str | None) -> PathStyle | None:
    """A :class:`PathStyle` when the configuration fixes the URL: a custom endpoint
    without a path, path-style addressing and a known signing region."""
    if not endpoint or style != "path" or not region:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") \
            or parts.query or parts.fragment:
        return None
    return PathStyle(f"{parts.scheme}://{parts.netloc}", region)


class StaticCredentials(NamedTuple):
    """A fixed key pair for botocore's signer (what botocore's ``Credentials``
    provides to it, without importing its credential chain machinery)."""

    access_key: str
    secret_key: str
    token: str | None = None

    def get_frozen_credentials(self) -> StaticCredentials:
        return self


def _host(url: str) -> str:
    """The ``host`` header SigV4 signs: lower case, no user info, no default port."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(f"{k}={v}" for k, v in pairs)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_headers(method: str, url: str, creds: Any, region: str, *,
                  now: float | None = None) -> dict[str, str]:
    """The headers SigV4 adds to a bodiless S3 request (``X-Amz-Date``, the
    session token if any, ``X-Amz-Content-SHA256``, ``Authorization``) for
    ``method`` of ``url``, signed with ``creds`` (frozen: ``access_key``,
    ``secret_key``, ``token``) for ``region`` at ``now`` (seconds since the
    epoch; the current time by default).

    The same headers as botocore's ``S3SigV4Auth.add_auth`` on an
    ``AWSRequest`` with no headers and no body: the signed headers are
    ``host`` and the ``x-amz-*`` ones, the path is signed as it stands (S3
    paths are not normalised) and the payload is the empty body's hash."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    day = stamp[:8]
    headers = {"X-Amz-Date": stamp}
    if creds.token:
        headers["X-Amz-Security-Token"] = creds.token
    headers["X-Amz-Content-SHA256"] = _EMPTY_SHA256
    signed = {"host": _host(url), **{k.lower(): " ".join(v.split()) for k, v in headers.items()}}
    names = sorted(signed)
    parts = urlsplit(url)
    canonical = "\n".join([
        method.upper(), parts.path, _canonical_query(parts.query),
        "".join(f"{n}:{signed[n]}\n" for n in names), ";".join(names), _EMPTY_SHA256])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(f"AWS4{creds.secret_key}".encode(), day)
    for step in (region, "s3", "aws4_request"):
        key = _hmac(key, step)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
                                f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return headers


class SignedGets:
    """Thread-safe caches of object URLs and of GET signatures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._urls: dict[tuple[str, str], str] = {}
        self._signatures: dict[tuple[str, str, str, str | None],
                               tuple[dict[str, str], float]] = {}

    def object_url(self, client: Any, bucket: str, key: str) -> str:
        """The object's URL as botocore addresses it (endpoint, virtual-host or
        path style, key quoting), without any signature (so no secret in it).

        ``client`` is a botocore client, or a :class:`PathStyle` endpoint."""
        with self._lock:
            url = self._urls.get((bucket, key))
        if url is not None:
            return url
        if isinstance(client, PathStyle):
            url = client.url(bucket, key)
        else:
            signed = str(client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60))
            url = signed.split("?", 1)[0]  # only X-Amz-* signing parameters follow
        with self._lock:
            if len(self._urls) >= _URL_CACHE:
                self._urls.clear()
            self._urls[(bucket, key)] = url
        return url

    def signed_headers(self, creds: Any, client: Any, url: str,
                       headers: dict[str, str], *, method: str = "GET") -> dict[str, str]:
        """``headers`` plus the SigV4 ``Authorization`` (and session token) for a
        ``method`` (GET or HEAD) of ``url`` with ``creds`` (``None``: anonymous, unsigned).

        The signature covers the host and the ``x-amz-*`` headers only (``Range``
        and ``If-Match`` travel unsigned, as SigV4 allows), so one signature serves
        every ranged GET of an object for ``_SIGNATURE_REUSE`` seconds, well inside
        S3's 15-minute clock window; rotated credentials get a new one at once.
        Signing per request cost 0.1 ms of Python per part."""
        if creds is None:
            return headers
        frozen = creds.get_frozen_credentials()
        key = (method, url, frozen.access_key, frozen.token)
        now = time.monotonic()
        with self._lock:
            hit = self._signatures.get(key)
        if hit is None or now - hit[1] > _SIGNATURE_REUSE:
            region = client.region if isinstance(client, PathStyle) else client.meta.region_name
            hit = (sigv4_headers(method, url, frozen, region), now)
            with self._lock:
                if len(self._signatures) >= _URL_CACHE:
                    self._signatures.clear()
                self._signatures[key] = hit
        return {**headers, **hit[0]}

    def clear(self) -> None:
        with self._lock:
            self._urls.clear()
            self._signatures.clear()
