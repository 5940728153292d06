"""One object to copy (:class:`Job`): where from, where to, and what became of it.
The plan (:mod:`.plan`) makes one per object; each way of copying fills it in."""

from __future__ import annotations

import dataclasses
import functools
import os

from ..layers.stack import PolicyProvider
from ..providers.base import ObjectInfo
from ..uri import ParsedURI, redact_text

__all__ = ["Job"]


@dataclasses.dataclass
class Job:
    """One object to copy: where from, where to, and what became of it."""

    src: PolicyProvider
    src_uri: ParsedURI
    src_path: str
    info: ObjectInfo
    dst: PolicyProvider
    dst_uri: ParsedURI
    #: Remote destination path, or (local root dir, key parts) for a local destination.
    dst_path: str
    local: tuple[str, list[str]] | None
    #: Set once a remote destination is committed (it exists under its name).
    published: bool = False
    #: (hidden partial file, bytes in it) kept for --resume when the copy stopped.
    kept: tuple[str, int] | None = None
    #: The whole result was compared with a checksum the source stored.
    source_checked: bool = False
    #: Copied by the S3 server itself (:mod:`.server_side`), and what of the copy was
    #: compared with the source (None: nothing that vouches for its bytes).
    server_side: bool = False
    checked_by: str | None = None
    #: An S3 object onto itself with metadata given: S3 copies it onto itself with the
    #: new metadata (``aws s3 cp --metadata-directive REPLACE``), never through here.
    in_place: bool = False

    # (Cached: each object's outcome, progress and errors name it several times, and
    # redacting a URI is not free. A changed place is a new Job: dataclasses.replace.)
    @functools.cached_property
    def label(self) -> str:
        """The source as shown to the user (secrets redacted)."""
        return redact_text(self.src_uri.with_path(self.src_path))

    @functools.cached_property
    def dst_label(self) -> str:
        """The destination as shown to the user (secrets redacted)."""
        if self.local is not None:
            return os.path.join(self.local[0], *self.local[1])
        return redact_text(self.dst_uri.with_path(self.dst_path))
