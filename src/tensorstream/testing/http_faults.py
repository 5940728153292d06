"""The faults :class:`~tensorstream.testing.http_server.HTTPTestServer` applies
(:class:`HTTPFaults`: latency, pacing, cut or stalled bodies, scripted statuses, wrong
ranges, a replaced object, missing validators, redirects), to every request or to one
key's. ``tensorstream.testing.http_server`` names it too (its old home)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .fault_settings import KnownFields

__all__ = ["HTTPFaults"]


@dataclasses.dataclass
class HTTPFaults(KnownFields):
    """Misbehaviours the server applies to requests (thread-safe enough for tests:
    set attributes before the client runs)."""

    fixture: ClassVar[str] = "tensorstream_http"

    #: Only requests for this key are affected (``None``: every key).
    key: str | None = None
    #: Seconds to wait before answering.
    latency: float = 0.0
    #: Bytes per second per response body (writes are paced; a change applies
    #: to bodies in progress).
    rate_limit: int | None = None
    #: Close the connection after this many body bytes ...
    drop_after: int | None = None
    #: ... on this many responses longer than that (``None``: every one).
    drop_times: int | None = None
    #: Statuses answered, in order, before normal service resumes, e.g. ``[503, 503]``
    #: (a 2xx entry: that request is served normally). An entry is taken after
    #: ``latency``, by a request still there to be answered: one whose client hung up,
    #: or that ``cancel_requests`` ended, during the latency leaves it to the next.
    status_script: list[int] = dataclasses.field(default_factory=list)
    #: ``Retry-After`` seconds sent with scripted statuses.
    retry_after: float | None = None
    #: Answer ranged GETs with ``200`` and the whole body.
    ignore_range: bool = False
    #: Serve the bytes one past the requested range, and say so in ``Content-Range``.
    wrong_content_range: bool = False
    #: Omit ``Content-Length`` (the body is sent with chunked transfer encoding).
    no_content_length: bool = False
    #: Send bodies with ``Content-Encoding: gzip``.
    gzip: bool = False
    #: Seconds to stall after sending headers, before the body ...
    stall_after_headers: float = 0.0
    #: ... on this many responses (``None``: every response).
    stall_times: int | None = None
    #: Replace the object's bytes (new ETag) after this many GETs of it.
    replace_after_requests: int | None = None
    #: The new bytes (default: the old bytes with every byte inverted).
    replace_with: bytes | None = None
    #: Ignore ``If-Match`` (serve the current bytes whatever the client pinned).
    ignore_if_match: bool = False
    #: Answer every request with ``307`` to this base URL plus the request path.
    redirect_to: str | None = None
    #: Send no ``ETag`` at all (a server with Last-Modified only).
    no_etag: bool = False
    #: Send the ``ETag`` on HEAD answers only, never on GETs (HEAD and GET disagree).
    etag_on_head_only: bool = False
    #: Send no ``Last-Modified`` at all.
    no_last_modified: bool = False
    #: Ignore ``If-Unmodified-Since``.
    ignore_if_unmodified_since: bool = False

    # counters (managed by the server)
    dropped: int = 0
    stalled: int = 0
    gets: int = 0
    replaced: bool = False

    def reset(self) -> None:
        """Back to a well-behaved server."""
        for field in dataclasses.fields(self):
            default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                       else field.default)
            setattr(self, field.name, default)
