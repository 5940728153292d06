"""Signing the S3 provider's reads (GET, HEAD) on the HTTP data plane: object
URLs as botocore addresses them, and SigV4 ``Authorization`` headers reused
per object and method for a while."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

__all__ = ["PathStyle", "SignedGets", "StaticCredentials", "path_style", "requests_endpoint"]

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


def _no_global_endpoint(context: dict[str, Any] | None = None, **_: Any) -> None:
    if context is not None:
        context["use_global_endpoint"] = False


def requests_endpoint(client: Any) -> None:
    """Make ``client``'s presigned ``GetObject`` URLs (:meth:`SignedGets.object_url`)
    name the endpoint its requests go to. botocore presigns S3 URLs of the ``aws``
    partition for the global endpoint (``bucket.s3.amazonaws.com``, for backward
    compatibility) where a request goes to its region's (``bucket.s3.eu-west-1...``):
    reads and listings then went to two hosts, and the global one does not serve a
    bucket in an opt-in region or one botocore does not know. (The request's context
    is what botocore's endpoint resolution reads; one endpoint per client, as boto3.)"""
    client.meta.events.register("before-parameter-build.s3.GetObject", _no_global_endpoint)


class StaticCredentials(NamedTuple):
    """A fixed key pair for botocore's signer (what botocore's ``Credentials``
    provides to it, without importing its credential chain machinery)."""

    access_key: str
    secret_key: str
    token: str | None = None

    def get_frozen_credentials(self) -> StaticCredentials:
        return self


class SignedGets:
    """Thread-safe caches of object URLs and of GET signatures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._urls: dict[tuple[str, str, str], str] = {}
        self._signatures: dict[tuple[str, str, str, str, str | None],
                               tuple[dict[str, str], float]] = {}

    def object_url(self, client: Any, bucket: str, key: str) -> str:
        """The object's URL as botocore addresses it (endpoint, virtual-host or
        path style, key quoting), without any signature (so no secret in it).

        ``client`` is a botocore client, or a :class:`PathStyle` endpoint."""
        where = (bucket, key, _region(client))  # a bucket's region may be learnt later
        with self._lock:
            url = self._urls.get(where)
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
            self._urls[where] = url
        return url

    def signed_headers(self, creds: Any, client: Any, url: str,
                       headers: dict[str, str], *, method: str = "GET") -> dict[str, str]:
        """``headers`` plus botocore's SigV4 ``Authorization`` (and session token) for a
        ``method`` (GET or HEAD) of ``url`` with ``creds`` (``None``: anonymous, unsigned).

        The signature covers the host and the ``x-amz-*`` headers only (``Range``
        and ``If-Match`` travel unsigned, as SigV4 allows), so one signature serves
        every ranged GET of an object for ``_SIGNATURE_REUSE`` seconds, well inside
        S3's 15-minute clock window; rotated credentials get a new one at once.
        Signing per request cost 0.1 ms of Python per part."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        if creds is None:
            return headers
        frozen = creds.get_frozen_credentials()
        region = _region(client)
        key = (method, url, region, frozen.access_key, frozen.token)
        now = time.monotonic()
        with self._lock:
            hit = self._signatures.get(key)
        if hit is None or now - hit[1] > _SIGNATURE_REUSE:
            request = AWSRequest(method=method, url=url, headers={})
            S3SigV4Auth(frozen, "s3", region).add_auth(request)
            hit = (dict(request.headers.items()), now)
            with self._lock:
                if len(self._signatures) >= _URL_CACHE:
                    self._signatures.clear()
                self._signatures[key] = hit
        return {**headers, **hit[0]}

    def clear(self) -> None:
        with self._lock:
            self._urls.clear()
            self._signatures.clear()


def _region(client: Any) -> str:
    """The region ``client`` (a botocore client or a :class:`PathStyle`) signs for."""
    return str(client.region if isinstance(client, PathStyle) else client.meta.region_name)
