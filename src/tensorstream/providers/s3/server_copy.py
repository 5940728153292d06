"""Copies within one S3 store made by S3 itself: no byte goes through this machine.

``aws s3 cp``, s5cmd and rclone copy ``s3://a/k`` to ``s3://b/k`` on one endpoint with
``CopyObject`` (up to 5 GiB) or a multipart upload of ``UploadPartCopy`` parts
(``x-amz-copy-source-range``); :func:`server_copy` does the same, with the checks
tensorstream's copies make:

* **One version.** The source is looked at first (``HEAD`` with ``If-Match``: the ETag
  the listing saw) and every copy request names that ETag
  (``x-amz-copy-source-if-match``): a source replaced meanwhile fails with
  ``PreconditionFailed`` (:class:`~tensorstream.errors.ObjectChangedError`).
* **Compared, where S3 makes it possible.** A source stored in one piece (its ETag the
  MD5 of its bytes) gets one ``CopyObject``, whose copy has the same MD5. A source
  uploaded in parts is copied part for part in its own layout (each part's range from
  ``HEAD ?partNumber=N``), so the copy's ETag (the MD5 of the parts' MD5s, ``-N``) is the
  source's: it is computed from the parts' ETags before anything is published, and
  compared again after. A server that ignores the condition (moto) is caught by these
  comparisons, never published as a mix. Where the ETags cannot be equal (SSE-KMS: one
  ``CopyObject`` then; a source in one piece larger than the cutoff; a layout S3 does not
  tell), only the size is compared, and the copy is said to be not verified.
* **Nothing left behind.** A multipart copy that fails is aborted; a published copy
  that fails its comparison is deleted again (as the streamed writer does).
* **Metadata** as ``aws s3 cp``: ``CopyObject`` copies it (``MetadataDirective`` COPY); a
  multipart copy sends the source's Content-Type, Cache-Control, Content-Disposition,
  Content-Encoding, Content-Language, Expires and user metadata with the upload, and its
  tags (``GetObjectTagging`` first, as ``aws s3 cp`` reads them; tags that cannot be
  read refuse the copy, as aws fails it). Fields
  the caller sets (``metadata``: ``--content-type``, ``--metadata``...) replace the
  source's: ``CopyObject`` then sends ``REPLACE`` with the source's other fields, so
  both ways store what a streamed copy does (:mod:`.metadata`). ``props``
  (``--copy-props``): ``metadata-directive`` keeps no tags (no ``GetObjectTagging``;
  ``CopyObject`` with ``TaggingDirective`` REPLACE), ``none`` neither tags nor the
  source's fields (``MetadataDirective`` REPLACE with the caller's alone).

A server that answers ``501``/``NotImplemented`` raises :class:`ServerCopyUnsupported`
(the caller falls back to a streamed copy). Access refused is said for the side it is
about: the source was read by the ``HEAD`` first, so a refused copy request is the
destination's; a source archived in Glacier and not restored (S3 refuses its copy with a
403 too) is said to be, from its ``HEAD``, before anything is sent.

The requests and what a copy ends in are in :mod:`.server_copy_calls`; the copy in
parts in :mod:`.server_copy_parts`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import (
    ConfigurationError,
    IntegrityError,
    InvalidURIError,
    MissingCredentialsError,
    ObjectChangedError,
    PermissionDeniedError,
    TensorstreamError,
)
from ..base import ObjectInfo
from .errors import WrongRegionError
from .etags import KMS_ENCRYPTION, etag_md5
from .key_limit import key_too_long
from .metadata import carried_from_head, checked_carried
from .server_copy_calls import (
    IN_PARTS,
    ONE_PIECE,
    Calls,
    Copied,
    ServerCopyUnsupported,
    head_source,
    refused_writing,
    remove,
    source_tags,
    split,
)
from .server_copy_parts import copy_parts
from .tags import header_or_later, put_later

__all__ = ["COPY_CUTOFF", "Copied", "ServerCopyUnsupported", "same_credentials", "server_copy"]

#: The largest object one ``CopyObject`` copies (S3's limit, and rclone's cut-off).
COPY_CUTOFF = 5 << 30
#: Storage classes whose objects S3 copies only once restored.
_ARCHIVES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
#: The fields of a HEAD an object changed in place keeps (:func:`_kept_in_place`).
_KEPT_IN_PLACE = ("StorageClass", "ServerSideEncryption", "SSEKMSKeyId", "BucketKeyEnabled",
                  "WebsiteRedirectLocation")


def same_credentials(a: Any, b: Any) -> bool:
    """Whether two S3 providers sign with the same credentials (a copy request reads
    the source with the destination's: another key pair per side may not read it)."""
    ca, cb = getattr(a, "credentials", None), getattr(b, "credentials", None)
    if ca is None or cb is None or ca.anonymous or cb.anonymous:
        return False

    def key(c: Any) -> tuple[Any, ...]:
        return tuple(f.value if f is not None else None for f in (
            c.access_key_id, c.secret_access_key, c.session_token, c.profile))

    return key(ca) == key(cb)


async def server_copy(src: Any, src_path: str, info: ObjectInfo, dst: Any, dst_path: str, *,
                      cutoff: int = COPY_CUTOFF, part_size: int, concurrency: int,
                      check: bool = True, metadata: dict[str, Any] | None = None,
                      advance: Callable[[int], None] | None = None,
                      in_place: bool = False, lacks: frozenset[str] = frozenset(),
                      props: str = "default") -> Copied:
    """Copy ``src_path`` (as listed: ``info``) to ``dst_path`` on the server; ``src`` and
    ``dst`` are policy-wrapped S3 providers of one store and one key pair (the request
    goes through ``dst``). ``cutoff``: the largest object stored in one piece that one
    ``CopyObject`` copies (a larger one goes in ``part_size`` parts). ``check``: look at
    the copy's size after it is published. ``metadata``: upload arguments that replace the
    source's (``ContentType``, ``Metadata``, ...). ``advance(n)``: ``n`` more bytes are
    copied. ``in_place``: ``dst_path`` is ``src_path`` (its metadata changed: S3 takes
    such a copy only with ``metadata``); a copy that fails a check after it is published
    is then left as S3 made it, never deleted (it is the only one). ``lacks``: the ways
    (:data:`ONE_PIECE`, :data:`IN_PARTS`) this store said it has not: an object that
    needs one raises :class:`ServerCopyUnsupported` at once. ``props``: what the copy
    carries of the source (``--copy-props``: ``default``, ``metadata-directive`` or
    ``none``; with ``none``, ``metadata`` is all the copy gets)."""
    if (why := key_too_long(dst_path.partition("/")[2])) is not None:
        raise InvalidURIError(why)  # before a request (a planned copy never gets here)
    call = Calls(dst, in_place=in_place)
    try:
        head = await head_source(call, src_path, info)
    except ConfigurationError as exc:
        if isinstance(exc, WrongRegionError | MissingCredentialsError):
            raise
        # A HEAD's bare 400 says no reason (an SSE-C object read without its key is one):
        # the streamed copy's read gets S3's reason in its body, or copies the object.
        raise ServerCopyUnsupported(f"S3 gave no reason for refusing the source's HEAD "
                                    f"({exc.message})", this_object=True) from exc
    etag = str(head.get("ETag") or "")
    size = int(head.get("ContentLength", info.size))
    if size != info.size:
        raise ObjectChangedError(f"the source is {size} bytes now, {info.size} when listed")
    if head.get("SSECustomerAlgorithm"):
        # The copy would need the customer's key for both sides: the streamed copy says why.
        raise ServerCopyUnsupported("the source is encrypted with a customer key (SSE-C)",
                                    this_object=True)
    if not etag:  # (every S3 answer names one; a copy that pins nothing is not ours)
        raise ServerCopyUnsupported("the source's HEAD names no ETag to pin the copy to",
                                    this_object=True)
    if (archived := _archived(head)) is not None:
        # S3 refuses the copy with a bare 403 (ObjectNotInActiveTierError), which read as
        # the destination's; aws s3 cp skips such objects with the same advice.
        raise PermissionDeniedError(
            f"the source is archived (storage class {archived}) and not restored: S3 copies "
            "it only once restored (aws s3api restore-object), then copy it again")
    # The ETag as an MD5 (of the bytes, or of the parts' MD5s, -N); under SSE-KMS it is not.
    md5 = etag_md5(etag) if head.get("ServerSideEncryption") not in KMS_ENCRYPTION else None
    way = ONE_PIECE if size <= cutoff and (md5 is None or md5[1] is None) else IN_PARTS
    if way in lacks:
        raise ServerCopyUnsupported(f"the server does not support {way} (NotImplemented)",
                                    way=way)
    kept = _kept_in_place(head) if in_place else {}
    if props != "default":
        # (a CopyObject copies the tags unless told not to; an upload has none unless sent)
        kept["TaggingDirective"] = "REPLACE"
    carried = carried_from_head(head) if props != "none" else {}
    if way == IN_PARTS and props == "default":
        # CopyObject keeps the object's tags (TaggingDirective COPY); a new upload has none
        # unless given them (as aws s3 cp gives them: --copy-props default).
        kept.update(await source_tags(call, src_path,
                                      nothing="nothing was changed" if in_place
                                      else "nothing was copied"))
    tags_later: list[dict[str, str]] = []  # (one CopyObject: S3 copies the tags itself)
    if way == ONE_PIECE:
        try:
            copied = await _copy_object(
                call, src_path, dst_path, etag, md5[0] if md5 else None,
                # (onto itself, S3 takes it only with REPLACE)
                {**_replaced(carried, metadata, props == "none" or (
                    in_place and props != "default")), **kept},
                kms_source=head.get("ServerSideEncryption") in KMS_ENCRYPTION)
        except ServerCopyUnsupported as exc:
            try:
                tagged = props == "default" and bool(await source_tags(call, src_path,
                                                                       nothing=""))
            except TensorstreamError:
                tagged = False  # (not known: taken as the store's 501, as before)
            if tagged:
                # An S3 Express directory bucket answers 501 to a CopyObject that copies
                # non-empty tags (COPY, the default), and to that one only: CopyObject is
                # there for the other objects.
                raise ServerCopyUnsupported(
                    f"{exc.message}: the destination takes no copy of its tags (an S3 "
                    "Express directory bucket holds none; --copy-props metadata-directive, "
                    "or copy_props=, leaves them out)", this_object=True) from exc
            raise
        if advance is not None:
            advance(size)
    else:
        kept.pop("TaggingDirective", None)  # (a CopyObject's: the upload is sent no tags)
        # Tags too long for the upload's header are set after it (as aws s3 cp does).
        fields, tags_later = header_or_later(
            {**checked_carried({**carried, **(metadata or {})}), **kept})
        copied = await copy_parts(call, src_path, dst_path, etag, md5, size, fields,
                                  part_size=part_size, concurrency=concurrency,
                                  advance=advance,
                                  kms_source=head.get("ServerSideEncryption") in KMS_ENCRYPTION)
    if check:
        await _check_size(call, dst_path, size, copied.version_id)
    await put_later(lambda op, **kw: call(op, dst_path, **kw), *split(dst_path),
                    tags_later, lambda: remove(call, dst_path, copied.version_id, copied.etag),
                    version_id=copied.version_id)
    return copied


def _kept_in_place(head: dict[str, Any]) -> dict[str, Any]:
    """What an object whose metadata is changed in place keeps of its HEAD that a copy
    request sets anew where it is not sent: its storage class (else STANDARD), its
    encryption (else the bucket's default: an object under a KMS key of its own became
    SSE-S3) and its website redirect."""
    return {name: head[name] for name in _KEPT_IN_PLACE if head.get(name)}


def _archived(head: dict[str, Any]) -> str | None:
    """The archive a source's HEAD says it is in and not restored from (its storage
    class, or Intelligent-Tiering's archive tier), else None."""
    restored = 'ongoing-request="false"' in str(head.get("Restore") or "").replace(" ", "")
    storage = str(head.get("StorageClass") or "")
    if storage in _ARCHIVES and not restored:
        return storage
    if head.get("ArchiveStatus") and not restored:  # (INTELLIGENT_TIERING's archive tiers)
        return f"{storage or 'INTELLIGENT_TIERING'}, {head['ArchiveStatus']}"
    return None


def _replaced(carried: dict[str, Any], metadata: dict[str, Any] | None,
              replace: bool = False) -> dict[str, Any]:
    """``CopyObject`` arguments for ``metadata`` set by the caller: none (S3 copies the
    source's) or ``REPLACE`` with every field, the source's (``carried``) under the
    caller's. ``replace``: ``REPLACE`` even with nothing set (``--copy-props none``)."""
    if not metadata and not replace:
        return {}
    fields = {k: v for k, v in checked_carried({**carried, **(metadata or {})}).items()
              if v}
    return {"MetadataDirective": "REPLACE", **fields}


async def _copy_object(call: Calls, src_path: str, dst_path: str, etag: str,
                       md5: str | None, replaced: dict[str, Any], *,
                       kms_source: bool = False) -> Copied:
    """One ``CopyObject``: of a source stored in one piece, its copy's ETag is its MD5
    (``md5``; None: the source's ETag is no MD5, nothing to compare). ``replaced``:
    the metadata arguments when the caller set some (see :func:`_replaced`)."""
    bucket, key = split(dst_path)
    source = dict(zip(("Bucket", "Key"), split(src_path), strict=True))
    try:
        resp = await call("copy_object", dst_path, Bucket=bucket, Key=key, CopySource=source,
                          CopySourceIfMatch=etag, **replaced)
    except PermissionDeniedError as exc:
        raise refused_writing(exc, kms_source=kms_source) from exc
    got = (resp.get("CopyObjectResult") or {}).get("ETag")
    version = resp.get("VersionId")
    if md5 is None or resp.get("ServerSideEncryption") in KMS_ENCRYPTION or etag_md5(got) is None:
        # (the destination's own encryption: its ETag is no MD5)
        return Copied(None, version_id=version, etag=got)
    if etag_md5(got) != (md5, None):
        then = await remove(call, dst_path, version, got)
        raise ObjectChangedError(
            f"the copy's ETag {got} is not the source's {etag}: the source changed while it "
            f"was copied (or the server copied other bytes); {then}")
    return Copied("ETag", version_id=version, etag=got)


async def _check_size(call: Calls, dst_path: str, size: int,
                      version_id: str | None) -> None:
    bucket, key = split(dst_path)
    head = await call("head_object", dst_path, Bucket=bucket, Key=key)
    got = int(head.get("ContentLength", -1))
    if got != size:  # (the version the copy wrote, else the object looked at)
        then = await remove(call, dst_path, version_id, head.get("ETag"))
        raise IntegrityError(f"the copy is {got} bytes, the source {size}; {then}")
