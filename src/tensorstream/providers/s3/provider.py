"""S3 (and S3-compatible) provider.

Reads run on the one HTTP data plane (:mod:`.._http.range_get`): ``stat`` is
one signed HEAD, a read is one signed ranged GET pinned with ``If-Match``,
its answer checked like every HTTP answer (status, ``Content-Range`` with
total, ``Content-Length``, ``Content-Encoding``, ETag) and its body received
straight into the caller's buffer. ``open_range_blocking`` and
``readinto_blocking`` run in the calling thread; the async ``readinto`` and
``stat`` run the same code on worker threads. botocore is used for what it
is good at, never for moving read bytes: a plain synchronous client, built
from the resolved credentials, endpoint and settings (:mod:`.clients`,
:mod:`.session`), resolves the object's URL (endpoint rules, addressing style,
key quoting; cached per key, no secret in it) and botocore's ``S3SigV4Auth``
signs the requests in ``Authorization`` headers (:mod:`.signing`: one signature
per object and method for a minute, a new one at once for rotated
credentials; header signing keeps credentials out of URLs). Error answers go
through the provider's one S3 error table (:mod:`.errors`).

Listing (:mod:`.lister`) pages through ``ListObjectsV2`` with that same
botocore client on a worker thread. aiobotocore serves the writes: deletes and
the multipart writer (:class:`~tensorstream.providers.s3.writer.S3Writer`); its
client is only built when one of those is used. tensorstream's policy layer
does retries, so botocore's own retries are off (one attempt).

Paths are ``bucket/key``. See ``docs/s3.md``.
"""

from __future__ import annotations

import builtins
import logging
import os
import ssl
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

from ..._client_cert import load_client_cert
from ...config import CommonConfig, split_options
from ...errors import (
    ConfigurationError,
    InsecureTLSWarning,
    InvalidRangeError,
    InvalidURIError,
    NotFoundError,
    ProtocolError,
    TensorstreamError,
)
from ...uri import is_utf8, redact, redact_text
from .._http.exchange import read_error_body
from .._http.headers import exception_error, parse_decimal, parse_http_date
from .._http.proxies import ProxySettings, resolve_proxies
from .._http.range_get import (
    Answer,
    Cancel,
    ConnectionPool,
    RangeBody,
    in_thread,
    open_range,
    open_whole,
    request,
)
from ..base import Capabilities, ObjectInfo, Pin, Provider, Writer
from .clients import S3Clients
from .config import OPTIONS, S3Credentials, process_timeout, resolve_s3_credentials
from .errors import WrongRegionError, map_s3_http_error
from .key_limit import key_too_long
from .lister import list_objects, lists_in_order
from .metadata import carried_from_headers
from .process import DEFAULT_CREDENTIAL_PROCESS_TIMEOUT
from .writer import KMS_ENCRYPTION, S3Writer

__all__ = ["S3Provider"]

log = logging.getLogger("tensorstream.s3")

_WRITE_MEMORY = 128 << 20  # bound on bytes in in-flight upload parts
_CHECKSUM_MODES = ("when_supported", "when_required")


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    if not bucket:
        raise InvalidURIError(f"S3 paths are bucket/key, got {path!r}")
    if not key:
        raise InvalidURIError(
            f"S3 paths are bucket/key, got {path!r}: s3://{bucket}/ is a bucket, not an "
            f"object; add the object's key (tensorstream ls s3://{bucket}/ lists them)")
    if not key.isascii() and not is_utf8(key):  # a local file name in another encoding
        raise InvalidURIError(f"S3 keys are UTF-8, {key!r} is not (a file name in "
                              "another encoding?)")
    return bucket, key


def _say_where_to_look(err: NotFoundError, bucket: str, key: str) -> None:
    """Add to a HEAD's 404 the listing that tells what is there: the 404 of a HEAD (no
    body) does not say whether the key or the bucket is missing."""
    if key.endswith("/"):  # a folder given where a file is read (deserialize("s3://b/llama/"))
        err.message += (f"; a key ending in '/' names a prefix, not an object: add the file's "
                        f"name (tensorstream ls {redact_text(f's3://{bucket}/{key}')} lists them)")
    else:
        parent = key.rpartition("/")[0]
        listing = redact_text(f"s3://{bucket}/{parent}/" if parent else f"s3://{bucket}/")
        err.message += (f"; 'tensorstream ls {listing}' lists what is there (a 404 does not say "
                        "whether the key or the bucket is missing)")
    err.args = (err.message,)


def _split_for_write(path: str) -> tuple[str, str]:
    """:func:`_split` of a key to write, refused when S3 cannot store it (too long)."""
    bucket, key = _split(path)
    if (why := key_too_long(key)) is not None:
        raise InvalidURIError(why)
    return bucket, key


def _path(value: Any) -> str | None:
    return None if value is None else os.fspath(value)


class S3Provider(S3Clients, Provider):
    """Objects in S3 or an S3-compatible store, addressed as ``bucket/key``."""

    schemes = ("s3",)
    service = "s3"
    capabilities: ClassVar[Capabilities] = Capabilities(
        write=True, list=True, delete=True, pinned_reads=True, blocking_reads=True,
        range_streams=True,
    )
    option_names = OPTIONS

    def __init__(
        self,
        credentials: S3Credentials,
        config: CommonConfig,
        *,
        checksum: str = "when_supported",
        ca_bundle: str | None = None,
        insecure: bool = False,
        proxies: ProxySettings | None = None,
        process_timeout: float = DEFAULT_CREDENTIAL_PROCESS_TIMEOUT,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        if client_key is not None and client_cert is None:
            raise ConfigurationError("client_key needs client_cert")
        if client_cert is not None:  # (botocore loads it itself: an encrypted key
            # prompted on the terminal, a mismatched one was a retried "cannot reach")
            load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), client_cert, client_key)
        if checksum not in _CHECKSUM_MODES:
            raise ConfigurationError(
                f"s3_checksum must be one of {', '.join(_CHECKSUM_MODES)}, got {checksum!r}"
            )
        super().__init__(
            credentials, config, checksum=checksum, ca_bundle=ca_bundle, insecure=insecure,
            proxies=proxies if proxies is not None else resolve_proxies(),
            process_timeout=process_timeout, client_cert=client_cert, client_key=client_key,
        )

    @classmethod
    def from_uri(cls, uri: Any, *, config: CommonConfig | None = None, **options: Any) -> S3Provider:
        """Resolve credentials (levels 1-4 now, botocore's chain on first use)."""
        creds = resolve_s3_credentials(options)
        insecure = bool(options.get("insecure"))
        if insecure:
            where = creds.endpoint.value if creds.endpoint else "AWS S3"
            warnings.warn(f"insecure=True: TLS certificates of {redact(where)} are not verified",
                          InsecureTLSWarning, stacklevel=3)
            log.warning("TLS verification disabled for %s (insecure=True)", redact(where))
        return cls(
            creds,
            config or split_options({})[0],
            checksum=str(options.get("s3_checksum") or "when_supported"),
            ca_bundle=options.get("ca_bundle"),
            insecure=insecure,
            proxies=resolve_proxies(options.get("proxy")),
            process_timeout=process_timeout(options),
            client_cert=_path(options.get("client_cert")),
            client_key=_path(options.get("client_key")),
        )

    def __repr__(self) -> str:
        endpoint = self.credentials.endpoint.value if self.credentials.endpoint else "aws"
        return f"S3Provider(endpoint={redact(endpoint)!r}, credentials from {self._key_source})"

    def __reduce__(self) -> Any:
        raise TypeError("S3Provider holds credentials and cannot be pickled")
    # -- reads (the HTTP data plane) -----------------------------------------------
    async def stat(self, path: str) -> ObjectInfo:
        return await in_thread(lambda: self.stat_blocking(path))

    def stat_blocking(self, path: str, cancel: Cancel | None = None) -> ObjectInfo:
        """:meth:`stat` (one signed HEAD) in the calling thread."""
        return self._in_bucket_region(path, lambda: self._stat_once(path, cancel))

    def _stat_once(self, path: str, cancel: Cancel | None) -> ObjectInfo:
        bucket, key = _split(path)
        client, pool = self._reads_for(bucket)
        with self._mapped_errors(path):  # signing may refresh the credentials
            url = self._gets.object_url(client, bucket, key)
            signed = self._gets.signed_headers(self._sync_creds, client, url,
                                               {"Accept-Encoding": "identity"}, method="HEAD")
        try:
            answer = request(pool, url, "HEAD", signed, self.config.timeouts, path=path,
                             service="s3", cancel=cancel)
        except TensorstreamError:
            raise
        except ssl.SSLError as exc:
            raise exception_error(exc, path=path, service="s3") from exc
        if answer.status != 200:
            err = map_s3_http_error(answer.status, answer.headers, answer.body, self._ctx(path))
            if answer.status == 400 and not answer.body and not isinstance(err,
                                                                          WrongRegionError):
                err = self._reason_for_400(client, pool, url, path, cancel) or err
            if answer.status == 404 and isinstance(err, NotFoundError):
                _say_where_to_look(err, bucket, key)
            raise err
        return _head_info(path, answer)

    def _reason_for_400(self, client: Any, pool: ConnectionPool, url: str, path: str,
                        cancel: Cancel | None) -> TensorstreamError | None:
        """The error S3 gives a GET of byte 0, for a HEAD answered with a bare 400.

        S3 answers a HEAD without a body: an expired session token, an SSE-C object
        read without its key and a malformed request were all "S3 rejected the
        request (400)", the source of the keys unnamed. The GET's XML ``Code`` says
        which (``None``: it says nothing more either)."""
        try:
            with self._mapped_errors(path):
                signed = self._gets.signed_headers(
                    self._sync_creds, client, url,
                    {"Accept-Encoding": "identity", "Range": "bytes=0-0"})
            answer = request(pool, url, "GET", signed, self.config.timeouts, path=path,
                             service="s3", cancel=cancel)
        except (TensorstreamError, OSError):
            return None
        if answer.status < 400 or not answer.body:
            return None
        return map_s3_http_error(answer.status, answer.headers, answer.body, self._ctx(path))

    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        """One signed ranged GET received into ``buffer`` on a worker thread (the
        same request as :meth:`readinto_blocking`)."""
        if offset < 0:
            raise InvalidRangeError(f"negative offset {offset}")
        if not len(buffer):
            return 0
        return await in_thread(lambda: self._open(
            path, offset, offset + len(buffer), pin, None).readinto(buffer))

    def open_range_blocking(
        self, path: str, start: int, end: int, *, pin: Pin | None = None
    ) -> RangeBody:
        """One signed GET of ``[start, end)`` whose body is read in order (thread-safe)."""
        return self._open(path, start, end, pin, None)

    def _open(self, path: str, start: int, end: int, pin: Pin | None,
              cancel: Cancel | None) -> RangeBody:
        return self._in_bucket_region(path, lambda: self._open_once(path, start, end, pin,
                                                                    cancel))

    def _signed_get(self, path: str) -> tuple[ConnectionPool, str, dict[str, str],
                                              Callable[[Any, str], Any]]:
        """A GET of ``path`` signed for its bucket's region: the pool of that region's
        connections, the URL, the signed headers, and the error for a refusal (S3's
        error answer, mapped)."""
        bucket, key = _split(path)
        client, pool = self._reads_for(bucket)
        with self._mapped_errors(path):  # signing may refresh the credentials
            url = self._gets.object_url(client, bucket, key)
            signed = self._gets.signed_headers(self._sync_creds, client, url,
                                               {"Accept-Encoding": "identity"})
        ctx = self._ctx(path)

        def on_status(resp: Any, _where: str) -> Any:
            return map_s3_http_error(resp.status, resp.headers, read_error_body(resp), ctx)

        return pool, url, signed, on_status

    def _open_once(self, path: str, start: int, end: int, pin: Pin | None,
                   cancel: Cancel | None) -> RangeBody:
        pool, url, signed, on_status = self._signed_get(path)

        def confirm() -> Pin:  # the version now, for an answer without validators
            return Pin.of(self.stat_blocking(path))

        try:
            return open_range(pool, url, start, end, signed, pin, self.config.timeouts,
                              path=path, service="s3", on_status=on_status, cancel=cancel,
                              confirm=confirm)
        except ssl.SSLError as exc:
            raise exception_error(exc, path=path, service="s3") from exc

    def open_whole_blocking(self, path: str) -> tuple[ObjectInfo, RangeBody] | None:
        """What :meth:`stat` reports and the body of every byte, from one signed
        GET (``Range: bytes=0-``); ``None`` when that answer cannot stand in for
        the ``HEAD`` (ask :meth:`stat`). Saves a load one round trip."""
        return self._in_bucket_region(path, lambda: self._open_whole_once(path))

    def _open_whole_once(self, path: str) -> tuple[ObjectInfo, RangeBody] | None:
        pool, url, signed, on_status = self._signed_get(path)
        try:
            got = open_whole(pool, url, signed, self.config.timeouts, path=path, service="s3",
                             on_status=on_status)
        except ssl.SSLError as exc:
            raise exception_error(exc, path=path, service="s3") from exc
        if got is None:
            return None
        h, body = got
        return ObjectInfo(path=path, size=body.end, etag=h.get("ETag"),
                          mtime=parse_http_date(h.get("Last-Modified")),
                          version=h.get("x-amz-version-id"),
                          extra=_extra(h)), body

    # -- list / delete ------------------------------------------------------------
    #: ``list``/``list_level`` take ``start_after`` (a retried listing resumes there).
    resumes_listing = True

    def lists_in_order(self, prefix: str) -> bool:
        """Whether ``prefix`` is listed in key order, so ``start_after`` resumes its
        listing: not in a directory bucket (S3 Express One Zone), which lists in no
        order and has no ``StartAfter``, nor in a bucket found listed in an order of
        its own (an S3-compatible store's)."""
        return lists_in_order(self, prefix.partition("/")[0])

    async def list(self, prefix: str, *,  # type: ignore[override]
                   start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        """Objects under ``bucket/prefix``, in key order (S3 lists in UTF-8 order);
        ``start_after``: only those after that path (``StartAfter``).

        Directory-marker keys (ending in ``/``) are skipped.
        """
        async for info in list_objects(self, prefix, None, start_after=start_after):
            yield info

    async def list_level(self, prefix: str, *,
                         start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        """One level under ``bucket/prefix``, in key order, as ``aws s3 ls`` lists it
        (``Delimiter=/``): the objects there, and each deeper prefix once as an entry
        whose path ends in ``/`` (size 0) -- not every key below it. ``start_after``:
        as :meth:`list` (S3 gives a deeper prefix named there again)."""
        async for info in list_objects(self, prefix, "/", start_after=start_after):
            yield info

    async def list_buckets(self) -> builtins.list[tuple[str, Any]]:
        """``[(bucket name, creation time)]`` the credentials can see (``tensorstream ls s3://``)."""
        resp = await self._call("list_buckets", "")
        if "Buckets" not in resp and "Owner" not in resp:
            # (botocore reads any other document, a proxy's page, as no bucket at all)
            raise ProtocolError("a 200 OK that is not a ListBuckets answer (no <Buckets>): "
                                "a proxy or a gateway in front of S3? check the endpoint",
                                service="s3", path="")
        buckets = resp.get("Buckets", ())
        if not all(b.get("Name") for b in buckets):  # (botocore leaves out what the XML lacks)
            raise ProtocolError("the ListBuckets answer lists a bucket without a name",
                                service="s3", path="")
        return [(b["Name"], b.get("CreationDate")) for b in buckets]

    async def default_encryption(self, bucket: str) -> str | None:
        """The encryption ``bucket`` applies to an object stored without one named
        (``GetBucketEncryption``'s ``SSEAlgorithm``: ``AES256``, ``aws:kms``, ...); None
        where it has none or these credentials may not ask."""
        try:
            answer = await self._call("get_bucket_encryption", bucket, Bucket=bucket)
        except TensorstreamError:
            return None
        config = answer.get("ServerSideEncryptionConfiguration") or {}
        for rule in config.get("Rules") or []:
            algorithm = (rule.get("ApplyServerSideEncryptionByDefault") or {}).get("SSEAlgorithm")
            if algorithm:
                return str(algorithm)
        return None

    async def first_part(self, path: str, etag: str) -> tuple[int, int] | None:
        """``(part 1's size, the parts count)`` of an object uploaded in parts, the
        version ``etag`` (``HEAD ?partNumber=1``); None where S3 does not say (one piece,
        another version, a server that takes no ``partNumber``)."""
        bucket, key = _split(path)
        try:
            answer = await self._call("head_object", path, Bucket=bucket, Key=key,
                                      PartNumber=1, IfMatch=etag)
        except TensorstreamError:
            return None
        size, count = answer.get("ContentLength"), answer.get("PartsCount")
        if not (isinstance(size, int) and isinstance(count, int)) or size <= 0 or count < 1:
            return None
        return size, count

    async def delete(self, path: str) -> None:
        bucket, key = _split(path)
        await self._call("head_object", path, Bucket=bucket, Key=key)  # NotFoundError if absent
        await self._call("delete_object", path, Bucket=bucket, Key=key)

    # -- writes -------------------------------------------------------------------
    def open_writer(self, path: str, *, metadata: dict[str, Any] | None = None,
                    **kwargs: Any) -> Writer:
        """An atomic writer of ``path``; ``metadata``: upload arguments stored with the
        object (``ContentType``, ``CacheControl``, ``Metadata``, ...: see :mod:`.metadata`)."""
        bucket, key = _split_for_write(path)
        x = self.config.transfer
        part_size = max(x.part_size, 5 << 20)

        async def call(op: str, **kw: Any) -> Any:
            return await self._call(op, path, **kw)

        return S3Writer(
            call, bucket, key,
            part_size=part_size,
            max_in_flight=max(1, min(x.concurrency, _WRITE_MEMORY // part_size)),
            checksum=self.checksum == "when_supported",
            retry=self.config.retry,
            metadata=metadata,
        )


def _head_info(path: str, answer: Answer) -> ObjectInfo:
    """What a HEAD answer says about an object (as botocore's ``head_object``)."""
    h = answer.headers
    size = parse_decimal(h.get("Content-Length"))
    if size is None:
        raise ProtocolError("HEAD answer without a usable Content-Length", service="s3",
                            path=redact(path))
    return ObjectInfo(
        path=path,
        size=size,
        etag=h.get("ETag"),
        mtime=parse_http_date(h.get("Last-Modified")),
        version=h.get("x-amz-version-id"),
        extra=_extra(h),
    )


def _extra(headers: Any) -> dict[str, Any]:
    """``ObjectInfo.extra`` of a HEAD/GET answer: its Content-Type, under
    ``"s3_metadata"`` what a copy of the object carries (:mod:`.metadata`), and under
    ``"etag_not_md5"`` whether the answer names an encryption under which the ETag is
    no MD5 of the bytes (SSE-KMS, DSSE-KMS, SSE-C; a listing's entry cannot say)."""
    return {"content_type": headers.get("Content-Type"),
            "s3_metadata": carried_from_headers(headers),
            "etag_not_md5": bool(
                headers.get("x-amz-server-side-encryption") in KMS_ENCRYPTION
                or headers.get("x-amz-server-side-encryption-customer-algorithm"))}
