"""``cp``/``sync`` between two places of one S3 store: copied by S3 itself.

Where the source and the destination are one S3 store (:mod:`.places`) reached with one
key pair, each object is copied on the server
(:mod:`tensorstream.providers.s3.server_copy`: ``CopyObject``, ``UploadPartCopy``), as
``aws s3 cp``, s5cmd and rclone do: no byte of it goes through this machine. Otherwise,
with ``server_side_copy=False`` (``--no-server-side-copy``), or where the server answers
that it cannot (``501 NotImplemented``: said once in the log), the copy streams the bytes
as it does between any two stores (:mod:`.remote`); a store that lacks one way of copying
(``CopyObject`` for an object in one piece, ``UploadPartCopy`` for parts) loses only that
one, for the rest of the run. An object onto itself with new
metadata (``Job.in_place``) is copied by S3 or not at all.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import UnsupportedOperationError
from ..uri import redact_text

if TYPE_CHECKING:
    from .copier import _Copier
    from .job import Job
    from .plan import Planner

__all__ = ["copy_on_server", "takes"]

log = logging.getLogger("tensorstream.copy")


def takes(c: Planner, job: Job) -> bool:
    """Whether ``job`` is copied on the server."""
    if not c.server_side_copy or "all" in c.server_copy_lacks or job.local is not None:
        return False
    if job.src_uri.scheme != "s3" or job.dst_uri.scheme != "s3":
        return False
    from ..providers.s3.provider import S3Provider
    from ..providers.s3.server_copy import same_credentials

    src, dst = getattr(job.src, "inner", None), getattr(job.dst, "inner", None)
    return (isinstance(src, S3Provider) and isinstance(dst, S3Provider)
            and same_credentials(src, dst) and c._one_store(job.src_uri, job.dst_uri))


async def copy_on_server(c: _Copier, job: Job) -> bool:
    """Copy ``job`` on the server; False (nothing copied, nothing left) where the
    server does not copy objects itself: the caller streams it then."""
    from ..providers.s3.server_copy import ServerCopyUnsupported, server_copy

    progress = c.progress
    options = c.object_metadata
    props = options.copy_props if options is not None else "default"
    # (--copy-props none: the caller's fields and a type guessed from the name, as an upload)
    fields = (options.for_object(job.src_path, None) if props == "none"
              else options.overrides() if options is not None else None)

    def advance(n: int) -> None:
        if progress is not None:
            progress.advance(job.label, n)

    try:
        copied = await server_copy(job.src, job.src_path, job.info, job.dst, job.dst_path,
                                   cutoff=c.copy_cutoff, part_size=c.part_size,
                                   concurrency=c.concurrency, check=c.verify, advance=advance,
                                   metadata=fields, in_place=job.in_place, props=props,
                                   lacks=frozenset(c.server_copy_lacks))
    except ServerCopyUnsupported as exc:
        if job.in_place:  # (streamed onto itself, it would be read and rewritten whole)
            raise UnsupportedOperationError(
                f"its metadata cannot be changed in place: {exc}; that is a copy by S3 "
                "onto itself, which is not made through this machine instead: nothing was "
                "changed") from exc
        if exc.this_object:  # (S3 still copies the others)
            log.warning("%s: %s; copying it through this machine instead", job.label,
                        redact_text(str(exc)))
        elif (way := exc.way or "all") not in c.server_copy_lacks:
            # Only that way is gone (a store may have CopyObject and no UploadPartCopy):
            # said once, for the rest of the run.
            c.server_copy_lacks.add(way)
            them = "every object" if way == "all" else f"the objects that need {way}"
            log.warning("%s: %s; copying %s through this machine instead", job.dst_label,
                        redact_text(str(exc)), them)
        return False
    job.published = True
    job.server_side = True
    job.checked_by = copied.verified_by if c.verify else None
    return True
