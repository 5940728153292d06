"""The one HTTP(S) data plane of tensorstream: every request of the HTTP and S3
providers' reads (ranged GETs, HEADs) goes through here, on ``http.client``
in the calling thread; the providers' async methods are derived from it
(:func:`in_thread`).

Why blocking: ``HTTPResponse.readinto`` fills slices of the destination
``memoryview`` with ``socket.recv_into``, which releases the GIL, so many
threads receive truly in parallel and each byte is written once, straight
into the caller's memory. Measured against aiohttp (event loop, one Python
callback per chunk, a copy out of its buffers) this plane is the fast one:
see ``docs/benchmarks.md``.

* :class:`ConnectionPool` (in :mod:`.connections`, with the TLS settings,
  redirect rules and :class:`Cancel`): thread-safe keep-alive pool keyed by
  ``(scheme, host, port)`` (one pool per TLS setting: a provider owns one).
  Only a connection whose response was read to its end, and that the server
  keeps open, goes back; any error, partial body or interruption closes it, so
  a reused connection can never yield the previous response's bytes. The pool
  forgets connections inherited across ``fork``.
* :func:`open_range`: one ranged GET (following redirects by a given policy),
  its answer checked by :func:`.headers.check_ranged_response` (status,
  ``Content-Range`` with total, ``Content-Length``, ``Content-Encoding``,
  ETag); its :class:`~.body.RangeBody` (in :mod:`.body`) is read in order
  into successive buffers, each filled whole or raising tensorstream errors
  (a ranged read into one buffer is one :func:`open_range` read whole).
* :func:`~.exchange.request` (in :mod:`.exchange`, with the sending of every
  request: pooled connection, redirects, deadlines): a small request
  (``HEAD``, a one-byte probe) under the same redirect rules.
* :func:`in_thread` (in :mod:`.threads`): the async side, on worker threads,
  cancellable.

A thread that keeps many requests in flight (the read-ahead engine's) asks
for :func:`.receiver.shared_receiving`: its bodies are then received by the
process's one receiving thread (epoll over every such connection, each
``recv_into`` straight into the destination) instead of by itself, so tens
of connections do not take turns at the GIL; the semantics below are the same.

Deadlines: each receive is bounded by a socket timeout (``timeout_idle``, cut
to what is left of ``timeout_total``), and the total deadline of the running
operation (:func:`~tensorstream.providers.base.current_deadline`) is checked
between receives, so a server trickling a byte at a time cannot hold a read
past it.

No retries here: :mod:`tensorstream.layers.stack` retries and resumes. The only
repeat is urllib3's classic one: a *reused* keep-alive connection that the
server closed while idle (or that held bytes its last answer left) is replaced
by a new one, once, before any byte of the answer arrived.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Mapping

from yarl import URL

from ...config import Timeouts
from ...errors import (
    InvalidRangeError,
    ProtocolError,
    TensorstreamError,
)
from ..base import Pin, current_deadline
from .body import RangeBody
from .connections import (
    Cancel,
    Cancelled,
    ConnectionPool,
    RedirectPolicy,
    TLSSettings,
)
from .exchange import (
    Answer,
    Confirm,
    HeaderView,
    StatusMapper,
    default_status,
    enter_gate,
    mark_adapting,
    origin_key,
    request,
    send_request,
    total_deadline_error,
)
from .headers import (
    body_refusal,
    check_ranged_response,
    conditional_headers,
    exception_error,
    needs_confirmation,
    note_served,
    parse_content_range,
    redact_path,
    served_version,
)
from .threads import in_thread  # re-exported: the async side lives there
from .throttle import Slot

__all__ = [
    "Answer", "Cancel", "Cancelled", "ConnectionPool", "RangeBody", "RedirectPolicy", "TLSSettings",
    "in_thread", "open_range", "open_whole", "request",
]


def open_range(
    pool: ConnectionPool,
    url: str,
    offset: int,
    end: int,
    headers: Mapping[str, str],
    pin: Pin | None,
    timeouts: Timeouts,
    *,
    path: str | None = None,
    service: str = "http",
    redirects: RedirectPolicy | None = None,
    on_status: StatusMapper | None = None,
    cancel: Cancel | None = None,
    confirm: Confirm | None = None,
) -> RangeBody:
    """Send a GET for bytes ``[offset, end)`` of ``url`` and check its answer;
    the body is then read with :meth:`RangeBody.readinto`.

    ``headers`` are sent as given (``Accept-Encoding: identity`` and ``Range``
    are added, and the validators of ``pin``: ``If-Match`` with a strong ETag,
    else ``If-Unmodified-Since``). The answer must report the pinned size and
    version (:func:`.headers.check_ranged_response`); one that reports no
    validator at all is confirmed after each read by ``confirm()`` (a HEAD)
    when given, else refused. With ``redirects``,
    its credential headers are sent to the first origin and dropped when a
    redirect leaves it; without, a redirect is mapped like any other status.
    ``path`` names the object in errors (redacted); ``on_status`` maps an
    unexpected status (default: the shared HTTP mapping); ``cancel`` lets
    another thread stop the request and its body.
    """
    where = path if path is not None else (URL(url, encoded=True).raw_path_qs or "/")
    if offset < 0 or end <= offset:
        raise InvalidRangeError(f"invalid range [{offset}, {end})", service=service,
                                path=redact_path(where))
    last = end - 1
    base = {**headers, "Accept-Encoding": "identity", "Range": f"bytes={offset}-{last}",
            **conditional_headers(pin)}
    mapper = on_status or default_status
    served: Pin | None = None
    origin = URL(url, encoded=True)
    slot: Slot | None = enter_gate(origin, service=service, path=where, cancel=cancel)
    status: int | None = None
    try:
        conn, resp, view, final = send_request(pool, url, "GET", base, timeouts, service=service,
                                        path=where, redirects=redirects, cancel=cancel)
        status = resp.status
        try:
            served = check_ranged_response(resp.status, view, first=offset, last=last,
                                           pin=pin, path=where, service=service,
                                           on_status=lambda r=resp: mapper(r, where))
            after = None
            if pin is not None and needs_confirmation(pin, served):
                after = _confirmation(pin, confirm, service=service, path=where)
            body = RangeBody(pool, origin_key(final), conn, resp, start=offset, end=end,
                             served=served, service=service, path=where,
                             idle=timeouts.idle, confirm=after, slot=slot)
            slot = None  # the body's now
            return body
        except BaseException:
            conn.close()  # never reuse a connection after an error
            raise
    except TensorstreamError as exc:
        note_served(mark_adapting(exc, origin), served)
        raise
    except (OSError, http.client.HTTPException) as exc:
        deadline = current_deadline()
        if deadline is not None and deadline.expired():
            raise total_deadline_error(0, service=service, path=where) from exc
        err = exception_error(exc, path=where, received=0, service=service)
        raise note_served(err, served) from exc
    finally:
        if slot is not None:
            slot.leave(status)


def _confirmation(pin: Pin, confirm: Confirm | None, *, service: str,
                  path: str) -> Callable[[], None]:
    """A check run after each read of an answer that carried no validator."""
    if confirm is None:
        raise ProtocolError("the answer carries neither ETag nor Last-Modified, so it "
                            "cannot be tied to the version being read", service=service,
                            path=redact_path(path))

    def check() -> None:
        pin.check(confirm(), service=service, path=redact_path(path), confirming=True)

    return check


def open_whole(
    pool: ConnectionPool,
    url: str,
    headers: Mapping[str, str],
    timeouts: Timeouts,
    *,
    path: str | None = None,
    service: str = "http",
    redirects: RedirectPolicy | None = None,
    on_status: StatusMapper | None = None,
    cancel: Cancel | None = None,
) -> tuple[HeaderView, RangeBody] | None:
    """Send a GET for every byte of ``url`` (``Range: bytes=0-``) and return the
    answer's headers with its body (whose ``end`` is the object's size), so one
    round trip gives both what a ``HEAD`` gives and the stream from byte 0.

    Only a clean answer is taken: a 206 of ``bytes 0-(N-1)/N`` with no content
    coding, a ``Content-Length`` (when sent) of the whole size and an ETag (what
    later ranged reads are pinned to; without one the ``HEAD`` may have one, and
    its answer decides the pin, as before). A temporary status (429, 5xx) raises
    its error (``on_status``, default: the shared HTTP mapping), for the caller's
    retry policy. Any other answer (200, 416 for
    an empty object, 404, 403...) returns ``None`` after closing the connection:
    the caller asks as before (``HEAD``, then a probe), which maps every status
    the way it always did. Connection errors raise, mapped as :func:`open_range`'s.
    """
    where = path if path is not None else (URL(url, encoded=True).raw_path_qs or "/")
    base = {**headers, "Accept-Encoding": "identity", "Range": "bytes=0-"}
    origin = URL(url, encoded=True)
    slot: Slot | None = enter_gate(origin, service=service, path=where, cancel=cancel)
    status: int | None = None
    try:
        try:
            conn, resp, view, final = send_request(pool, url, "GET", base, timeouts, service=service,
                                            path=where, redirects=redirects, cancel=cancel)
        except TensorstreamError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            deadline = current_deadline()
            if deadline is not None and deadline.expired():
                raise total_deadline_error(0, service=service, path=where) from exc
            raise exception_error(exc, path=where, received=0, service=service) from exc
        status = resp.status
        try:
            if resp.status == 429 or resp.status >= 500:  # temporary: retried like a HEAD's
                raise mark_adapting((on_status or default_status)(resp, where), origin)
            cr = parse_content_range(view.get("Content-Range"))
            length = view.get("Content-Length")
            served = served_version(view, cr.total if cr is not None else None)
            if (resp.status != 206 or body_refusal(view, stored_coding=service == "s3") is not None
                    or cr is None
                    or cr.total is None or cr.total == 0
                    or (cr.first, cr.last) != (0, cr.total - 1)
                    or (length is not None and length.strip() != str(cr.total))
                    or served.etag is None):
                conn.close()
                return None
            body = RangeBody(pool, origin_key(final), conn, resp, start=0, end=cr.total,
                             served=served, service=service, path=where, idle=timeouts.idle,
                             slot=slot)
            slot = None  # the body's now
        except BaseException:
            conn.close()  # never reuse a connection after an error
            raise
    finally:
        if slot is not None:
            slot.leave(status)
    return view, body
