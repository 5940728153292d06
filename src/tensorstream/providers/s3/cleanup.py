"""The removal of an object a write or a copy made and then failed (a check, its tags, an
abort that raced its publish): exactly what it wrote, never what the key held before nor
what another writer stored since.

* Where S3 named the version it wrote (a versioned bucket), that version is deleted
  (``VersionId``); ``null`` too, a versioning-suspended bucket's: a delete by key there
  removes the ``null`` version and puts a delete marker in its place, which hides the
  version the key held before (the one the failed write was to leave).
* Where it named none (an unversioned bucket), the delete is conditional on the ETag the
  write made (``If-Match``; S3 since 2024, moto): another writer's object stored since
  (between the look and the delete, say) answers ``412`` and is left. A store without
  conditional deletes that says so (``501 NotImplemented``) gets the delete by key, as
  before; one that ignores the header deletes by key all the same: the race remains there.

Left as it is: in a suspended bucket another writer's later write replaces the ``null``
version, and ``VersionId=null`` deletes theirs (S3 evaluates ``If-Match`` against the
current version only, not a version named).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import NotFoundError, ObjectChangedError, TensorstreamError, UnsupportedOperationError

__all__ = ["delete_written", "not_implemented", "the_written"]


def not_implemented(exc: BaseException) -> bool:
    """Whether a mapped S3 error is the server saying it has no such operation (or does
    not implement a header of it): ``501``, ``NotImplemented``."""
    cause = exc.__cause__
    response = getattr(cause, "response", None) or {}
    code = str((response.get("Error") or {}).get("Code") or "")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("NotImplemented", "XNotImplemented", "501") or status == 501


def the_written(version_id: str | None, etag: str | None) -> dict[str, str]:
    """``DeleteObject`` arguments that address what a write made: the version S3 named
    (``null`` included), else the ETag it made (``If-Match``), else nothing (by key)."""
    if version_id:
        return {"VersionId": str(version_id)}
    return {"IfMatch": str(etag)} if etag else {}


async def delete_written(send: Callable[..., Awaitable[Any]], bucket: str, key: str,
                         version_id: str | None, etag: str | None) -> bool:
    """Delete what a write made (:func:`the_written`); ``send(op, **kwargs)`` sends one
    request. False where the key holds another writer's object now (``412`` to the
    ``If-Match``): it is left; True where it holds nothing (gone already). Other errors
    raise."""
    args = the_written(version_id, etag)
    try:
        await send("delete_object", Bucket=bucket, Key=key, **args)
    except ObjectChangedError:
        if "IfMatch" not in args:
            raise
        return False
    except NotFoundError:
        # S3 answers a conditional delete of a key that holds nothing 404 NoSuchKey (a
        # delete by key, 204): what the write made is gone already (deleted by another),
        # which is what was asked; it was reported "could not be removed: it is there".
        if "IfMatch" not in args:
            raise
    except TensorstreamError as exc:
        if "IfMatch" not in args or not (
                isinstance(exc, UnsupportedOperationError) or not_implemented(exc)):
            raise
        await send("delete_object", Bucket=bucket, Key=key)  # (no conditional deletes)
    return True
