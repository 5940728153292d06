"""An S3 object's tags on its copy: in the upload's ``x-amz-tagging`` header where they
fit, else set by ``PutObjectTagging`` once the object is written.

S3 keeps up to 10 tags of 128-character keys and 256-character values: encoded, up to
about 35 KB, over what S3 (and most servers: 8 KB) takes in one header. ``aws s3 cp``
sends a tag set of at most 2 KiB encoded with the upload and sets a longer one after
it (``SetTagsSubscriber``); a ``PutObjectTagging`` that fails then fails the copy and
removes the object (a copy without its tags would look done: ``sync`` would skip it
from then on). :func:`header_or_later` and :func:`put_later` do the same, for a copy
S3 makes in parts and for a streamed one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from ...errors import PermissionDeniedError, TensorstreamError

__all__ = ["TAGGING_HEADER_MAX", "encode_tags", "header_or_later", "put_later", "the_version"]

#: The longest ``x-amz-tagging`` header an upload is sent (``aws s3 cp``'s, in bytes).
TAGGING_HEADER_MAX = 2 << 10


def the_version(version_id: str | None) -> dict[str, str]:
    """``VersionId=`` of a request addressing the version a write made (a versioned
    bucket's), or nothing where its answer named none (or the ``null`` version: the
    key's own)."""
    return {"VersionId": version_id} if version_id and version_id != "null" else {}


def encode_tags(tags: Iterable[tuple[str, str]]) -> str:
    """Tags as an ``x-amz-tagging`` header value (URL-encoded, as botocore sends it)."""
    return urlencode(list(tags), quote_via=quote)


def header_or_later(fields: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Upload arguments ``fields`` without a ``Tagging`` too long for a header, and its
    tags (a ``TagSet``) to set once the object is written (``[]``: none to set)."""
    tagging = fields.get("Tagging")
    if not tagging or len(str(tagging).encode()) <= TAGGING_HEADER_MAX:
        return fields, []
    later = [{"Key": k, "Value": v}
             for k, v in parse_qsl(str(tagging), keep_blank_values=True)]
    return {k: v for k, v in fields.items() if k != "Tagging"}, later


async def put_later(send: Callable[..., Awaitable[Any]], bucket: str, key: str,
                    tag_set: list[dict[str, str]],
                    remove: Callable[[], Awaitable[str]], *,
                    version_id: str | None = None) -> None:
    """``PutObjectTagging`` of ``tag_set`` on the object just written (``send(op,
    **kwargs)`` sends a request; ``version_id``: the version it wrote, in a versioned
    bucket). Refused or failed, the copy fails with what became of the object:
    ``remove()`` removes it (or says why it stays) and says so."""
    if not tag_set:
        return
    try:
        await send("put_object_tagging", Bucket=bucket, Key=key,
                   Tagging={"TagSet": tag_set}, **the_version(version_id))
    except TensorstreamError as exc:
        then = await remove()
        message = (
            f"the object was written, but its {len(tag_set)} tags (too long for the "
            f"upload's header, set after it as aws s3 cp does) could not be set "
            f"(PutObjectTagging; s3:PutObjectTagging on the destination): {exc.message}; "
            f"{then} (--copy-props metadata-directive, or copy_props=, leaves the tags out)")
        kind = PermissionDeniedError if isinstance(exc, PermissionDeniedError) else TensorstreamError
        raise kind(message) from exc
