"""Listing S3: ``ListObjectsV2`` pages, followed to the end, as :class:`ObjectInfo`.

Pages are fetched on a worker thread: where reads need no botocore client, one
signed GET each on the data plane (:func:`parse_list_page` reads its XML);
otherwise the reads' botocore client (never aiobotocore: a cp -r builds one
client and never loads aiohttp). A listing that would never end or would pass a
part off as the whole (a truncated page without a token, a token given twice,
endless empty pages) is a :class:`~tensorstream.errors.ProtocolError`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote_plus, urlencode
from xml.etree import ElementTree

from ...errors import InvalidURIError, ProtocolError
from ...uri import redact
from .._http.headers import parse_decimal
from .._http.range_get import ConnectionPool, in_thread, request
from ..base import ObjectInfo
from .clients import S3Clients
from .errors import map_s3_http_error
from .signing import PathStyle

__all__ = ["is_directory_bucket", "list_objects", "lists_in_order", "parse_list_page"]

# Real S3 may give a few empty truncated pages (deleted keys it skips); a run
# this long, each with a fresh token, is a server that would list forever.
_LIST_EMPTY_PAGES = 1000
#: A ListObjectsV2 page (1000 keys of up to 1 KiB) fits well inside this.
_LIST_BODY_LIMIT = 8 << 20
#: How a directory bucket's name ends (S3 Express One Zone: its keys come unordered).
_DIRECTORY_BUCKET = "--x-s3"

log = logging.getLogger("tensorstream.s3")


async def list_objects(s3: S3Clients, prefix: str, delimiter: str | None, *,
                       start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
    """The objects under ``bucket/prefix`` in key order (:meth:`S3Provider.list
    <tensorstream.providers.s3.provider.S3Provider.list>`); with a ``delimiter``,
    each deeper prefix once, as an entry whose path ends in it; with ``start_after``
    (a ``bucket/key`` path), those after it."""
    bucket, _, key_prefix = prefix.partition("/")
    if not bucket:
        raise InvalidURIError(f"S3 list prefixes are bucket[/prefix], got {prefix!r}")
    # Pages follow the continuation token (botocore's paginator would first
    # scan its data directories: ~0.1 s of CPU).
    args = {"Bucket": bucket, "Prefix": key_prefix}
    if delimiter:
        args["Delimiter"] = delimiter
    if start_after is not None:
        after_bucket, _, after_key = start_after.partition("/")
        if after_bucket != bucket:
            raise InvalidURIError(f"start_after {start_after!r} is not in bucket {bucket!r}")
        args["StartAfter"] = after_key

    def page_once() -> Any:
        client, pool = s3._reads_for(bucket)
        if isinstance(client, PathStyle):
            return _list_page(s3, client, pool, prefix, args)
        with s3._mapped_errors(prefix):
            page = client.list_objects_v2(**args)
        if not any(field in page for field in _PAGE_FIELDS):
            raise ProtocolError("a 200 OK that is not a ListObjectsV2 answer (none of its "
                                "fields): a proxy or a gateway in front of S3? check the "
                                "endpoint", service="s3", path=redact(prefix))
        return page

    def next_page() -> Any:
        return s3._in_bucket_region(prefix, page_once)

    tokens: set[str] = set()
    empty = 0  # consecutive truncated pages without an entry
    # S3 lists a general purpose bucket in UTF-8 byte order, which is str order: a key
    # at or before the one given last is a page repeated or a listing that went back
    # (it gave entries twice, or for ever with fresh tokens). A directory bucket
    # (S3 Express One Zone) lists in no order, and so do some S3-compatible stores
    # (Storj's gateway: in the order of its encrypted names): a key out of order given
    # by neither this page nor the one before is such a store's (see _OwnOrder).
    last: str | None = None
    order = _OwnOrder(s3, bucket, prefix)
    while True:
        page = await in_thread(next_page)
        contents = page.get("Contents", ())
        # (a page's deeper prefixes, merged into its keys' order; pages come in order)
        below = [{"Key": str(p["Prefix"]), "Size": 0, "Prefix": True}
                 for p in page.get("CommonPrefixes") or () if p.get("Prefix")]
        # (the next token is checked before this page's entries are given: a page
        # answered again with its own token is not given twice)
        token = page.get("NextContinuationToken")
        truncated = bool(page.get("IsTruncated"))
        if truncated:
            _check_token(token, tokens, prefix)
            empty = 0 if contents or below else empty + 1
            if empty >= _LIST_EMPTY_PAGES:
                raise ProtocolError(f"the listing gave {empty} truncated "
                                    "pages in a row without an entry, each with a new "
                                    "continuation token; it would never end", service="s3",
                                    path=redact(prefix))
        entries = sorted([*contents, *below], key=lambda o: str(o["Key"])) if below \
            else contents
        order.page([str(obj["Key"]) for obj in entries])
        for obj in entries:
            key = str(obj["Key"])
            order.check(key, last)
            last = key
            if obj.get("Prefix"):
                yield ObjectInfo(path=f"{bucket}/{key}", size=0)
                continue
            size = int(obj["Size"])
            if size < 0:
                raise ProtocolError(f"the listing gives key {key[:100]!r} a negative size "
                                    f"({size})", service="s3", path=redact(prefix))
            if key.endswith("/") and not size:
                continue  # a folder marker; one holding bytes is listed (cp reports it)
            yield ObjectInfo(
                path=f"{bucket}/{key}",
                size=size,
                etag=obj.get("ETag"),
                mtime=obj.get("LastModified"),
            )
        if not truncated:
            break
        assert token is not None  # (_check_token)
        tokens.add(token)
        args["ContinuationToken"] = token
        args.pop("StartAfter", None)  # (the token says where the next page starts)


class _OwnOrder:
    """That no key of a listing is given twice and no page comes again, and whether
    its keys come in S3's order.

    A key that its page or the one before gave, or a page with the keys of one given
    before (a fingerprint of each: a few bytes a page), is a page answered again or a
    listing that went back: a ProtocolError before it is given. A key at or before the
    one given last that neither gave is a store listing in an order of its own (a
    directory bucket, Storj's gateway): listed on, and a retried listing of that
    bucket starts again from its start (:func:`lists_in_order`)."""

    def __init__(self, s3: object, bucket: str, prefix: str) -> None:
        self._s3, self._bucket, self._prefix = s3, bucket, prefix
        self.ordered = lists_in_order(s3, bucket)
        self._before: frozenset[str] = frozenset()  # the previous page's keys
        self._here: frozenset[str] = frozenset()
        self._pages: set[int] = set()

    def page(self, keys: list[str]) -> None:
        """A page's keys, before any is given."""
        self._before, self._here = self._here, frozenset(keys)
        if len(self._here) != len(keys):
            raise self._twice(next(k for k in keys if keys.count(k) > 1), "in its page")
        if keys:
            fingerprint = hash(self._here)
            if fingerprint in self._pages:
                raise ProtocolError(
                    f"the listing gives a page it gave before again (keys {min(keys)[:100]!r} "
                    f"to {max(keys)[:100]!r}), with a new continuation token: not in S3's "
                    "order; listing on would never end", service="s3",
                    path=redact(self._prefix))
            self._pages.add(fingerprint)

    def check(self, key: str, last: str | None) -> None:
        """Refuse ``key``, about to be given after ``last``, if it was given before."""
        if key in self._before:
            raise self._twice(key, f"after {last[:100]!r}" if last is not None else "")
        if self.ordered and last is not None and key <= last:
            self.ordered = False
            _own_order.setdefault(self._s3, set()).add(self._bucket)
            log.info("s3://%s lists its keys in an order of its own, not S3's (%r after "
                     "%r): a key given twice is still refused", self._bucket, key[:100],
                     last[:100])

    def _twice(self, key: str, where: str) -> ProtocolError:
        return ProtocolError(
            f"the listing gives key {key[:100]!r} again {where}: not in S3's order (a page "
            "given again, or a listing that went back); listing on could give an object "
            "twice or never end", service="s3", path=redact(self._prefix))


#: The buckets each client found listed in an order of their own (see _OwnOrder).
_own_order: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


def lists_in_order(s3: object, bucket: str) -> bool:
    """Whether ``bucket`` is listed in key order, so that ``StartAfter`` resumes its
    listing: not a directory bucket, nor one found listed in an order of its own."""
    return not is_directory_bucket(bucket) and bucket not in _own_order.get(s3, ())


def is_directory_bucket(bucket: str) -> bool:
    """Whether ``bucket`` is a directory bucket (S3 Express One Zone), by its name."""
    return bucket.endswith(_DIRECTORY_BUCKET)


def _check_token(token: str | None, tokens: set[str], prefix: str) -> None:
    """Refuse a truncated page's ``token`` that could not list the rest."""
    if not token:
        # Ending here would pass a part of the listing off as all of it (and
        # sync --delete would remove what the rest holds).
        raise ProtocolError("the listing is truncated but gives no continuation "
                            "token to list the rest", service="s3", path=redact(prefix))
    if token in tokens:
        # A server answering the same page forever: listing on would never end.
        raise ProtocolError("the listing loops: the server gave a continuation token "
                            "it had given before", service="s3", path=redact(prefix))


class _ErrorAnswer(ProtocolError):
    """A 200 OK whose body is S3's ``<Error>`` (a gateway's): the caller maps it."""


#: What botocore parses out of a ListObjectsV2 answer: none of them, and the answer
#: was another document (an ``<Error>``, a proxy's page), whose fields it drops.
_PAGE_FIELDS = ("IsTruncated", "Name", "Prefix", "KeyCount", "MaxKeys", "Contents",
                "CommonPrefixes")


def _list_page(s3: S3Clients, light: PathStyle, pool: ConnectionPool, prefix: str,
               args: dict[str, str]) -> dict[str, Any]:
    """One ``ListObjectsV2`` page as botocore would return it (the fields
    :func:`list_objects` reads), by a signed GET on the data plane."""
    query = {"list-type": "2", "prefix": args["Prefix"], "encoding-type": "url"}
    if "Delimiter" in args:
        query["delimiter"] = args["Delimiter"]
    if "StartAfter" in args:
        query["start-after"] = args["StartAfter"]
    if "ContinuationToken" in args:
        query["continuation-token"] = args["ContinuationToken"]
    url = (f"{light.endpoint}/{quote(args['Bucket'], safe='')}?"
           + urlencode(sorted(query.items()), quote_via=quote, safe="-_.~"))
    signed = s3._gets.signed_headers(s3._sync_creds, light, url,
                                     {"Accept-Encoding": "identity"})
    answer = request(pool, url, "GET", signed, s3.config.timeouts, path=prefix,
                     service="s3", body_limit=_LIST_BODY_LIMIT)
    if answer.status != 200:
        raise map_s3_http_error(answer.status, answer.headers, answer.body,
                                s3._ctx(prefix))
    if not answer.complete:
        raise ProtocolError(f"a ListObjectsV2 page larger than {_LIST_BODY_LIMIT} bytes",
                            service="s3", path=redact(prefix))
    try:
        return parse_list_page(answer.body, prefix)
    except _ErrorAnswer:  # (S3's own refusal, as if it came with its status)
        raise map_s3_http_error(answer.status, answer.headers, answer.body,
                                s3._ctx(prefix)) from None


def parse_list_page(body: bytes, prefix: str) -> dict[str, Any]:
    """The fields of a ``ListObjectsV2`` answer that :func:`list_objects` uses,
    shaped as botocore returns them (keys URL-decoded, dates parsed)."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise ProtocolError("unreadable ListObjectsV2 answer", service="s3",
                            path=redact(prefix)) from exc
    # Another document (S3's <Error>, a proxy's XHTML page) read as a page had no
    # entries and no IsTruncated: an empty listing, which `sync --delete` acts on.
    tag = root.tag.rpartition("}")[2]
    if tag == "Error":
        raise _ErrorAnswer("the answer is S3's <Error>", service="s3", path=redact(prefix))
    if tag != "ListBucketResult":
        raise ProtocolError(f"a 200 OK that is not a ListObjectsV2 answer (its root is "
                            f"<{tag[:40]}>, not <ListBucketResult>): a proxy or a gateway "
                            "in front of S3? check the endpoint", service="s3",
                            path=redact(prefix))

    def text(node: Any, name: str) -> str | None:
        for child in node:
            if child.tag.rpartition("}")[2] == name:
                return str(child.text or "")
        return None

    encoded = text(root, "EncodingType") == "url"
    contents = []
    for node in root:
        if node.tag.rpartition("}")[2] != "Contents":
            continue
        key = text(node, "Key")
        if not key:  # (it was listed as the key "": the prefix itself)
            raise ProtocolError("the ListObjectsV2 answer lists an object without a key",
                                service="s3", path=redact(prefix))
        key = unquote_plus(key) if encoded else key
        modified = text(node, "LastModified")
        given = text(node, "Size") or "0"
        size = parse_decimal(given)
        if size is None:
            raise ProtocolError(f"the ListObjectsV2 answer gives key {key[:100]!r} the size "
                                f"{given[:40]!r}", service="s3", path=redact(prefix))
        try:
            mtime = datetime.fromisoformat(modified.replace("Z", "+00:00")) if modified else None
        except ValueError:
            raise ProtocolError(f"the ListObjectsV2 answer gives key {key[:100]!r} the date "
                                f"{(modified or '')[:40]!r}", service="s3",
                                path=redact(prefix)) from None
        contents.append({"Key": key, "Size": size, "ETag": text(node, "ETag"),
                         "LastModified": mtime})
    prefixes = []
    for node in root:
        if node.tag.rpartition("}")[2] == "CommonPrefixes" and (name := text(node, "Prefix")):
            prefixes.append({"Prefix": unquote_plus(name) if encoded else name})
    return {"Contents": contents, "CommonPrefixes": prefixes,
            "IsTruncated": (text(root, "IsTruncated") or "").lower() == "true",
            "NextContinuationToken": text(root, "NextContinuationToken")}
