"""What ``cp``/``sync`` stores with each S3 object it writes: the source's Content-Type,
user metadata and tags from S3 (as ``--copy-props`` chooses), a Content-Type guessed
from the name otherwise, the caller's fields over both
(:mod:`tensorstream.providers.s3.metadata`, as ``aws s3 cp``). The streamed copy
(:mod:`.remote`) and the server-side one (:mod:`.server_side`) store the same."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..providers.base import ObjectInfo
from ..providers.s3.metadata import MetadataOptions

if TYPE_CHECKING:
    from .copier import _Copier
    from .job import Job

__all__ = ["check_copy_props", "check_destination", "holds_fields", "stream_writer_options", "writer_options"]


def check_destination(options: MetadataOptions | None, scheme: str) -> None:
    """Refuse fields set for a destination that is not S3 (they would be dropped)."""
    if options is not None and options.overrides() and scheme != "s3":
        raise ConfigurationError(
            "--content-type, --cache-control and --metadata set what S3 stores with an "
            f"object; the destination is {scheme or 'local'}, which keeps none of it")


def check_copy_props(options: MetadataOptions | None, sources: list[str],
                     destination: str) -> None:
    """Refuse ``--copy-props none``/``metadata-directive`` where a side is not S3: it
    chooses what an S3 -> S3 copy carries from its source (aws s3 cp ignores it
    elsewhere; refused, so a choice never does nothing unsaid). ``sources`` and
    ``destination`` are schemes (``-``: stdin)."""
    if options is None or options.copy_props == "default":
        return
    for side, scheme in (*(("source", s) for s in sources), ("destination", destination)):
        if scheme != "s3":
            where = {"": "local", "file": "local", "-": "stdin"}.get(scheme, scheme)
            raise ConfigurationError(
                f"--copy-props {options.copy_props} chooses what a copy from S3 to S3 "
                f"carries from its source; the {side} is {where}, which carries none: "
                "leave --copy-props out")


def holds_fields(info: ObjectInfo, fields: dict[str, Any]) -> bool:
    """Whether the S3 object ``info`` (a HEAD's) already holds every field of ``fields``
    (``MetadataOptions.overrides()``): its user metadata as a whole, as ``--metadata``
    replaces it; keys compared in lower case, as S3 stores them."""
    held = info.extra.get("s3_metadata") or {}
    for name, value in fields.items():
        if name == "Metadata":
            lower = {str(k).lower(): v for k, v in value.items()}
            if {str(k).lower(): v for k, v in (held.get("Metadata") or {}).items()} != lower:
                return False
        elif held.get(name) != value:
            return False
    return True


async def writer_options(c: _Copier, job: Job) -> dict[str, Any]:
    """``open_writer`` options of ``job``'s destination: ``metadata`` for S3, the
    source's date for Redis (which ``sync`` then compares with the source's next one, as
    a local copy carries it: dated when written, a same-size update dated before the
    copy was taken as older than it and never copied)."""
    if job.dst_uri.scheme in ("redis", "rediss"):
        from .local import mtime_ns

        when = mtime_ns(job.info)  # (a date without a zone is UTC, as for a local copy)
        return {} if when is None else {"mtime": when / 1e9}
    if job.dst_uri.scheme != "s3":
        return {}
    options = c.object_metadata or MetadataOptions()
    source: dict[str, Any] | None = None
    if job.src_uri.scheme == "s3" and options.carries_fields:
        # A listing says nothing of an object's metadata: one HEAD (as aws s3 cp's
        # multipart copies make). The reads are pinned to the listed version.
        source = job.info.extra.get("s3_metadata")
        if source is None:
            source = (await job.src.stat(job.src_path)).extra.get("s3_metadata") or {}
    fields = options.for_object(job.src_path, source)
    if job.src_uri.scheme == "s3" and options.carries_tags:
        fields.update(await _source_tags(job))
    return {"metadata": fields}


async def _source_tags(job: Job) -> dict[str, Any]:
    """The S3 source's tags for its streamed copy (``Tagging``), as one ``CopyObject``
    keeps them (``--copy-props default``): read with the source's key pair; refused where
    they cannot be read."""
    from ..providers.s3.provider import S3Provider
    from ..providers.s3.server_copy_calls import Calls, source_tags

    if not isinstance(getattr(job.src, "inner", None), S3Provider):
        return {}
    return await source_tags(Calls(job.src), job.src_path, nothing="nothing was copied")


def stream_writer_options(options: MetadataOptions | None, scheme: str) -> dict[str, Any]:
    """``open_writer`` options for ``cp - DST`` (stdin: no name to guess a type from, as
    with ``aws s3 cp -``); fields set for a destination that is not S3 are refused, and
    so is ``--copy-props`` (one side is stdin or stdout)."""
    check_destination(options, scheme)
    check_copy_props(options, [] if scheme == "stdout" else ["-"], scheme)
    if scheme != "s3":
        return {}
    return {"metadata": (options or MetadataOptions()).for_object("", None)}
