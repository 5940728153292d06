"""``cp``/``sync``'s flags for what S3 stores with each object, named as ``aws s3 cp``
names them (:mod:`tensorstream.providers.s3.metadata`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_metadata_options", "metadata_options"]


def add_metadata_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("object metadata (an S3 destination)")
    g.add_argument("--content-type", metavar="TYPE",
                   help="Content-Type of every object written (default: an S3 source's own, "
                        "else guessed from the file name: config.json is application/json)")
    g.add_argument("--no-guess-mime-type", dest="guess_mime_type", action="store_false",
                   help="send no Content-Type guessed from the name (S3 then stores "
                        "binary/octet-stream)")
    g.add_argument("--cache-control", metavar="VALUE",
                   help="Cache-Control of every object written (default: an S3 source's own)")
    g.add_argument("--metadata", action="append", metavar="KEY=VALUE",
                   help="user metadata (x-amz-meta-KEY) of every object written, in place of "
                        "an S3 source's; KEY=VALUE[,KEY=VALUE...] or a JSON object; "
                        "repeatable")
    g.add_argument("--copy-props", choices=("none", "metadata-directive", "default"),
                   metavar="{none,metadata-directive,default}",
                   help="what a copy from S3 to S3 carries from its source, as aws s3 cp's: "
                        "default its Content-Type, Content-Language, Content-Encoding, "
                        "Content-Disposition, Cache-Control, Expires, user metadata and "
                        "tags; metadata-directive the same without its tags (no "
                        "s3:GetObjectTagging needed); none nothing of it (what is set here "
                        "and a type guessed from the name); none and metadata-directive are "
                        "refused where a side is not S3")


def metadata_options(args: argparse.Namespace) -> Any:
    """The flags as :class:`~tensorstream.providers.s3.metadata.MetadataOptions` (None:
    none given); raises :class:`~tensorstream.errors.ConfigurationError` for bad values."""
    content_type = getattr(args, "content_type", None)
    cache_control = getattr(args, "cache_control", None)
    given = getattr(args, "metadata", None)
    guess = getattr(args, "guess_mime_type", True)
    props = getattr(args, "copy_props", None) or "default"
    if content_type is None and cache_control is None and given is None and guess \
            and props == "default":
        return None
    from ..providers.s3.metadata import MetadataOptions, parse_metadata_args

    return MetadataOptions(
        content_type=content_type, cache_control=cache_control, guess_mime_type=guess,
        copy_props=props, metadata=parse_metadata_args(given) if given is not None else None)
