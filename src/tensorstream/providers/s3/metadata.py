"""What S3 stores with an object besides its bytes: Content-Type, Cache-Control and
the other ``Content-*`` headers, and user metadata (``x-amz-meta-*``).

As ``aws s3 cp`` (v2) does it:

* an upload from anything but S3 (a local file, HTTP, Redis) gets the Content-Type
  guessed from the source's name (:mod:`mimetypes`: ``config.json`` is
  ``application/json``; a name it does not know sends none, and S3 stores
  ``binary/octet-stream``), unless ``guess_mime_type=False`` (``--no-guess-mime-type``);
* a copy from S3 carries the source's Content-Type, Cache-Control,
  Content-Disposition, Content-Encoding, Content-Language, Expires and user metadata,
  whether S3 copies it (server-side) or the bytes go through this machine;
* ``content_type``/``cache_control`` given replace that field; ``metadata`` given
  replaces the user metadata as a whole (as ``--metadata`` with ``aws s3 cp``'s
  ``REPLACE``), the other fields are still carried;
* ``copy_props`` (``--copy-props``, as aws's) chooses what an S3 -> S3 copy carries from
  its source: ``default`` those fields and its tags, ``metadata-directive`` those fields
  and no tags, ``none`` nothing (the caller's fields and a type guessed from the name, as
  an upload from anything but S3 gets).

Values are checked before anything is sent, by S3's rules: header values of printable
US-ASCII (S3 takes user metadata only as US-ASCII over REST), keys of the characters an
HTTP header name allows (S3 stores them in lower case), user metadata of at most 2 KB
(keys and values together), every field under S3's 8 KB request header.
"""

from __future__ import annotations

import dataclasses
import json
import mimetypes
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import ConfigurationError

__all__ = ["CARRIED", "COPY_PROPS", "MetadataOptions", "carried_from_head", "carried_from_headers",
           "checked_carried", "parse_metadata_args", "validate_user_metadata"]

#: What a copy carries from an S3 source (HeadObject answer names = upload arguments).
CARRIED = ("ContentType", "CacheControl", "ContentDisposition", "ContentEncoding",
           "ContentLanguage", "Expires", "Metadata")
#: ``--copy-props``' values (aws s3 cp's): what an S3 -> S3 copy carries from its source.
COPY_PROPS = ("none", "metadata-directive", "default")
#: The same fields as HTTP headers (of a raw HEAD answer).
_HEADERS = {"content-type": "ContentType", "cache-control": "CacheControl",
            "content-disposition": "ContentDisposition", "content-encoding": "ContentEncoding",
            "content-language": "ContentLanguage", "expires": "Expires"}
_META = "x-amz-meta-"
#: S3: user metadata (keys and values, bytes) at most 2 KB; a request header at most 8 KB.
USER_METADATA_MAX = 2048
HEADER_MAX = 8192
# (fullmatch, never match: '$' also matches before a line break at the end)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110)
_VALUE = re.compile(r"[\x20-\x7e]*")  # printable US-ASCII (and space)


def _check_value(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, got {type(value).__name__}")
    if not _VALUE.fullmatch(value):
        bad = next(c for c in value if not "\x20" <= c <= "\x7e")
        raise ConfigurationError(
            f"{what} holds {bad!r}: S3 takes only printable US-ASCII here (no line breaks, "
            "tabs or other control characters); encode the value first (for example as "
            "percent-encoded UTF-8)")
    if len(value) > HEADER_MAX:
        raise ConfigurationError(f"{what} is {len(value)} characters; S3 takes at most "
                                 f"{HEADER_MAX} bytes in a request's headers")
    return value


def validate_user_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """``metadata`` as S3 stores it (keys in lower case), or a
    :class:`~tensorstream.errors.ConfigurationError` saying what is wrong. Values are
    not shown in the error (they may be tokens)."""
    if not isinstance(metadata, Mapping):
        raise ConfigurationError("metadata must map strings to strings "
                                 f"(got {type(metadata).__name__})")
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not _TOKEN.fullmatch(key):
            raise ConfigurationError(
                f"metadata key {key!r:.80} cannot be an S3 metadata name: use letters, digits "
                "and - _ . (no spaces, no ':' or '=')")
        low = key.lower()
        if low in out:
            raise ConfigurationError(f"metadata key {key!r} is given twice (S3 stores keys in "
                                     "lower case)")
        out[low] = _check_value(f"the value of metadata key {key!r}", value)
    size = sum(len(k) + len(v) for k, v in out.items())
    if size > USER_METADATA_MAX:
        raise ConfigurationError(
            f"user metadata is {size} bytes (keys and values together); S3 stores at most "
            f"{USER_METADATA_MAX} bytes of it per object")
    return out


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's members in order, a name given twice included."""


def parse_metadata_args(args: Iterable[str]) -> dict[str, str]:
    """``--metadata`` arguments (each ``KEY=VALUE[,KEY=VALUE...]`` or a JSON object, as
    ``aws s3 cp`` takes them; given several times, as s5cmd) as one mapping."""
    out: dict[str, str] = {}
    for arg in args:
        pairs: list[tuple[str, Any]]
        if arg.lstrip().startswith("{"):
            try:
                # (as pairs: a dict would keep the last of a name given twice, unsaid)
                doc = json.loads(arg, object_pairs_hook=_Pairs)
            except ValueError as exc:
                raise ConfigurationError(f"--metadata: not a JSON object: {exc}") from None
            if not isinstance(doc, _Pairs) or not all(isinstance(v, str) for _, v in doc):
                raise ConfigurationError('--metadata: the JSON form maps names to strings: '
                                         '{"name": "value"}')
            pairs = doc
        else:
            pairs = []
            for item in arg.split(","):
                key, eq, value = item.partition("=")
                if not eq or not key.strip():
                    # (the item itself is not shown: it may be part of a value)
                    raise ConfigurationError(
                        "--metadata: an item is not KEY=VALUE (pairs are separated by "
                        "commas; for a value with a comma use the JSON form "
                        "--metadata '{\"key\": \"a,b\"}')")
                pairs.append((key.strip(), value))
        for key, value in pairs:
            if key.lower() in {k.lower() for k in out}:
                raise ConfigurationError(f"--metadata: key {key!r} is given twice")
            out[key] = value
    return validate_user_metadata(out)


def carried_from_head(head: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a copy carries, from botocore's ``head_object`` answer."""
    return {name: head[name] for name in CARRIED if head.get(name)}


def checked_carried(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` carried from an S3 source (any the caller set over them), with their
    user metadata checked by S3's rules: another store may hand back what S3 takes not
    (raw UTF-8), and botocore's own refusal would quote the value. The streamed and the
    server-side copy both send what this returns."""
    out = dict(fields)
    if out.get("Metadata"):
        try:
            out["Metadata"] = validate_user_metadata(out["Metadata"])
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"the source's user metadata cannot be stored in S3: {exc.message}; "
                "set other metadata with --metadata") from None
    return out


def carried_from_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    """The fields a copy carries, from a raw HEAD/GET answer's headers."""
    out: dict[str, Any] = {}
    user: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in _HEADERS and value:
            out[_HEADERS[low]] = value
        elif low.startswith(_META) and len(low) > len(_META):
            user[low[len(_META):]] = value
    if user:
        out["Metadata"] = user
    return out


@dataclasses.dataclass(frozen=True)
class MetadataOptions:
    """``cp``/``sync``'s choices for what S3 stores with each object written (see the
    module docstring). Checked when made."""

    content_type: str | None = None
    cache_control: str | None = None
    #: User metadata (``x-amz-meta-*``); None: carried from an S3 source, none otherwise.
    metadata: Mapping[str, str] | None = None
    guess_mime_type: bool = True
    #: What an S3 -> S3 copy carries from its source (:data:`COPY_PROPS`): ``default``
    #: its fields (:data:`CARRIED`) and tags, ``metadata-directive`` its fields, ``none``
    #: nothing of it.
    copy_props: str = "default"

    def __post_init__(self) -> None:
        if self.copy_props not in COPY_PROPS:
            raise ConfigurationError(
                f"copy_props is {self.copy_props!r:.40}; it takes one of "
                + ", ".join(repr(v) for v in COPY_PROPS))
        if self.content_type is not None:
            _check_value("content_type", self.content_type)
        if self.cache_control is not None:
            _check_value("cache_control", self.cache_control)
        if self.metadata is not None:
            object.__setattr__(self, "metadata", validate_user_metadata(self.metadata))

    @property
    def given(self) -> bool:
        """Whether any field was set (not only the defaults)."""
        return (self.content_type is not None or self.cache_control is not None
                or self.metadata is not None or not self.guess_mime_type
                or self.copy_props != "default")

    @property
    def carries_fields(self) -> bool:
        """Whether a copy from S3 carries its source's fields (not ``--copy-props none``)."""
        return self.copy_props != "none"

    @property
    def carries_tags(self) -> bool:
        """Whether a copy from S3 keeps its source's tags (``--copy-props default``)."""
        return self.copy_props == "default"

    def overrides(self) -> dict[str, Any]:
        """The upload arguments the options set themselves."""
        out: dict[str, Any] = {}
        if self.content_type is not None:
            out["ContentType"] = self.content_type
        if self.cache_control is not None:
            out["CacheControl"] = self.cache_control
        if self.metadata is not None:
            out["Metadata"] = dict(self.metadata)
        return out

    def for_object(self, name: str, source: Mapping[str, Any] | None) -> dict[str, Any]:
        """The upload arguments for an object named ``name`` at its source: ``source``,
        the fields carried from an S3 source (None: not from S3, the type is guessed
        from ``name``), with the options' own fields over them. ``copy_props`` ``none``
        carries nothing of ``source``: the type is guessed then too."""
        if not self.carries_fields:
            source = None
        if source is not None:
            out = dict(source) if self.metadata is not None else checked_carried(source)
        else:
            out = {}
            guessed = mimetypes.guess_type(name)[0] if self.guess_mime_type \
                else None
            if guessed:
                out["ContentType"] = guessed
        out.update(self.overrides())
        return {k: v for k, v in out.items() if v not in (None, "", {})}
