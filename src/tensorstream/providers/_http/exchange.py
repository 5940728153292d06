"""One HTTP(S) request of the data plane (:mod:`.range_get`) up to its answer's headers:
sent on a pooled connection, a reused keep-alive connection that the server closed
replaced once, redirects followed by a :class:`~.connections.RedirectPolicy`, each
wait bounded by the running operation's deadline; and :func:`request`, a small
request read whole."""

from __future__ import annotations

import dataclasses
import http.client
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from yarl import URL

from ..._log_redaction import register_query_secrets
from ...config import Timeouts
from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    ProtocolError,
    ServiceUnavailableError,
    StorageTimeoutError,
    TensorstreamError,
)
from ...uri_redaction import redact_text
from ..base import Deadline, Pin, current_deadline
from .connections import (
    Cancel,
    Cancelled,
    ConnectionPool,
    ForwardingConnection,
    ProxyRefused,
    RedirectPolicy,
    current,
)
from .headers import (
    CREDENTIALS_DROPPED,
    LIST_HEADERS,
    REDIRECT_STATUSES,
    exception_error,
    is_metadata_address,
    redact_path,
    redirect_step,
    refuse_metadata_target,
    status_error,
)
from .throttle import Slot, gate

__all__ = ["Answer", "Confirm", "HeaderView", "OriginKey", "StatusMapper", "default_status", "enter_gate",
           "mark_adapting", "origin_key", "read_error_body", "request", "send_request",
           "total_deadline_error"]

#: At most this many bytes of an error body are read (S3 XML errors are small).
_ERROR_BODY_LIMIT = 64 << 10


OriginKey = tuple[str, str, int]
#: Builds the error for a status other than 200/206 from the open response.
StatusMapper = Callable[[http.client.HTTPResponse, str], TensorstreamError]
#: Reports the object's version now (a HEAD), to confirm an answer that
#: carried no validator of its own.
Confirm = Callable[[], Pin]



def total_deadline_error(received: int, *, service: str, path: str) -> StorageTimeoutError:
    # (``path`` is ``/path?query``: every query value hidden, as an HTTP(S) URL's)
    return Deadline(None, None).error(received, service=service, path=redact_path(path))


class HeaderView(dict[str, str]):
    """A response's headers read once into a dict, looked up case-insensitively
    (the first of repeated headers wins, as with ``HTTPMessage.get``, except
    that the codings' lists are joined and differing repeats are noted). Every
    ``HTTPMessage.get`` scans and lower-cases the whole header list: a few
    microseconds each, several per ranged GET, all under the GIL."""

    def __init__(self, message: Any) -> None:
        super().__init__()
        #: Names given twice with different values (see :func:`.headers.body_refusal`).
        self.conflicting: set[str] = set()
        for name, value in message.raw_items():
            key = name.lower()
            if key not in self:
                self[key] = value
            elif key in LIST_HEADERS:  # RFC 9110 5.3: repeats of a list are one list
                self[key] = f"{self[key]}, {value}"
            elif self[key].strip() != value.strip():
                self.conflicting.add(key)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


def origin_key(url: URL) -> OriginKey:
    if url.scheme not in ("http", "https") or not url.host:
        raise ProtocolError(f"unsupported URL scheme {url.scheme!r}")
    return (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))


def default_status(resp: http.client.HTTPResponse, path: str) -> TensorstreamError:
    # a 400's page may be nginx's about a client certificate: read (a bounded start) for it
    body = read_error_body(resp) if resp.status == 400 else b""
    return status_error(resp.status, resp.reason, resp.headers, path=path, body=body)


def read_error_body(resp: http.client.HTTPResponse) -> bytes:
    """At most ``_ERROR_BODY_LIMIT`` bytes of an error answer's body (best effort)."""
    try:
        return resp.read(_ERROR_BODY_LIMIT)
    except (OSError, http.client.HTTPException):
        return b""


def _check_redirect(target: URL, policy: RedirectPolicy, path: str) -> None:
    if policy.allow_private or not target.host:
        return
    addresses = [target.host]
    if not is_metadata_address(target.host):
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            addresses += [str(i[4][0]) for i in infos]
        except OSError:
            pass  # unresolvable: the request itself will fail and say so
    refuse_metadata_target(addresses, path=path)


def _exchange(pool: ConnectionPool, url: URL, method: str, headers: dict[str, str],
              timeouts: Timeouts, *, service: str, path: str, cancel: Cancel | None
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send one request and read the status line and headers (each wait bounded
    by the running operation's deadline, when it has one)."""
    key = origin_key(url)
    target = url.raw_path_qs or "/"  # sent verbatim: never re-encode a signed URL
    cancel = cancel if cancel is not None else getattr(current, "cancel", None)
    deadline = current_deadline()
    timed = deadline is not None and deadline.at is not None
    for attempt in range(2):
        if timed:
            assert deadline is not None
            if deadline.expired():
                raise total_deadline_error(0, service=service, path=path)
            left = deadline.remaining() or 0.0
            timeouts = dataclasses.replace(timeouts, connect=max(0.001, min(
                timeouts.connect, left)))
        try:
            # The repeat takes a new connection: the other idle ones were most
            # likely closed by the same server (its keep-alive timeout) as well.
            conn, reused = pool.acquire(key, timeouts, fresh=attempt > 0)
        except TimeoutError as exc:
            if timed and deadline is not None and deadline.expired():
                raise total_deadline_error(0, service=service, path=path) from exc
            raise StorageTimeoutError(
                f"connect timeout to {pool.describe(key)}",
                timeout="connect", service=service, path=redact_path(path)) from exc
        except ProxyRefused as exc:
            raise exc.error(service=service, path=redact_path(path)) from None
        except OSError as exc:
            if isinstance(exc, ssl.SSLError):
                raise  # mapped with its advice (plain text, an untrusted CA)
            # Name the address: a port or host typo shows (the path alone does not).
            raise ConnectionFailedError(
                f"cannot connect to {pool.describe(key)} ({type(exc).__name__}: "
                f"{redact_text(str(exc))})", service=service, path=redact_path(path)) from exc
        try:
            if cancel is not None:
                cancel.attach(conn)
                if cancel.cancelled:
                    raise Cancelled("the caller was cancelled", service=service,
                                    path=redact_path(path))
            if timed and conn.sock is not None:
                assert deadline is not None
                conn.sock.settimeout(deadline.wait_bound())
            conn.request(method, target, headers=headers)
            return conn, conn.getresponse()
        except (http.client.BadStatusLine, ConnectionResetError, BrokenPipeError):
            conn.close()
            if not reused or (cancel is not None and cancel.cancelled):
                raise
            # The server closed this keep-alive connection while it sat idle
            # (RemoteDisconnected is a BadStatusLine), or what came first was no
            # status line: bytes its previous answer left (a CRLF after a body, a
            # body sent with a HEAD answer).
        except (UnicodeEncodeError, ValueError) as exc:
            conn.close()
            if isinstance(exc, UnicodeEncodeError) or str(exc).startswith("Invalid header"):
                # http.client's error holds the whole header value: a token, a key id
                # (from a source resolved without this check, e.g. botocore's chain)
                raise ConfigurationError(
                    "a request header value cannot be sent (a line break, or a character "
                    "beyond Latin-1): check the credentials; the value is not shown",
                    service=service, path=redact_path(path)) from None
            raise
        except BaseException:
            conn.close()
            raise
    raise AssertionError("unreachable")


@dataclasses.dataclass
class Answer:
    """A final (non-redirect) answer's status line and headers; its body was
    read (at most ``_ERROR_BODY_LIMIT`` bytes) and its connection released."""

    status: int
    reason: str
    headers: HeaderView
    body: bytes
    #: The body was read to its end (not cut at the request's ``body_limit``).
    complete: bool = True


def send_request(pool: ConnectionPool, url: str, method: str, headers: Mapping[str, str],
          timeouts: Timeouts, *, service: str, path: str, redirects: RedirectPolicy | None,
          cancel: Cancel | None
          ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, HeaderView, URL]:
    """One request, following redirects by ``redirects``' rules (without, a
    redirect is an answer like any other); returns the final answer."""
    current = URL(url, encoded=True)
    creds = dict(redirects.credentials) if redirects is not None else {}
    hops = redirects.max_redirects if redirects is not None else 0
    dropped = False  # credentials were dropped at a hop to another origin
    for _ in range(hops + 1):
        conn, resp = _exchange(pool, current, method, {**headers, **creds}, timeouts,
                               service=service, path=path, cancel=cancel)
        try:
            if resp.status == 407 and isinstance(conn, ForwardingConnection):
                # The proxy's answer, not the origin's: say so, never retry it as one.
                _, host, port = origin_key(current)
                raise ProxyRefused.refusal(conn.proxy, host, port, 407, resp.reason,
                                           what="the request").error(
                    service=service, path=redact_path(path))
            view = HeaderView(resp.headers)
            location = view.get("Location")
            if redirects is not None and resp.status in REDIRECT_STATUSES and location:
                conn.close()  # never drain a body we do not want
                target, same_origin = redirect_step(current, location, path=path)
                register_query_secrets(str(target))  # (a presigned URL, echoed alone)
                if not same_origin:
                    dropped = dropped or bool(creds)
                    creds = {}  # never forward credentials to another origin (or to http)
                _check_redirect(target, redirects, path)
                current = target
                continue
        except BaseException:
            conn.close()  # never reuse a connection after an error
            raise
        if dropped and resp.status in (401, 403):
            # A refusal's error must not say the credentials were sent (both header
            # objects: the status is mapped from either, see status_error).
            for message in (view, resp.headers):
                setattr(message, CREDENTIALS_DROPPED, True)
        return conn, resp, view, current
    raise ProtocolError(f"more than {hops} redirects", service=service,
                        path=redact_path(path))


def enter_gate(url: URL, *, service: str, path: str, cancel: Cancel | None) -> Slot:
    """A slot in the origin's :class:`~.throttle.Gate` (waits while it is full)."""
    deadline = current_deadline()
    cancel = cancel if cancel is not None else getattr(current, "cancel", None)
    slot = gate(origin_key(url)).enter(
        deadline.at if deadline is not None else None,
        (lambda: cancel.cancelled) if cancel is not None else None)
    if slot is None:
        if cancel is not None and cancel.cancelled:
            raise Cancelled("the caller was cancelled", service=service, path=redact_path(path))
        raise total_deadline_error(0, service=service, path=path)
    return slot


def mark_adapting(exc: TensorstreamError, url: URL) -> TensorstreamError:
    """Mark a throttle while other requests to the origin are in flight (the
    caller still holds its slot): the width is adapting (:mod:`.throttle`), so
    the retry layer is more patient with it."""
    if isinstance(exc, ServiceUnavailableError) and gate(origin_key(url)).shared():
        exc.adapting = True
    return exc


def _small_body(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, limit: int,
                *, service: str, path: str) -> bytes:
    """Up to ``limit`` bytes of ``resp``'s body, under the operation's total deadline
    when it has one: a body trickled a byte at a time is never idle, and a listing
    page sent so ran past ``timeout_total`` for as long as the server went on."""
    deadline = current_deadline()
    if deadline is None or deadline.at is None:
        return resp.read(limit)
    parts: list[bytes] = []
    got = 0
    while got < limit:
        if deadline.expired():
            raise total_deadline_error(got, service=service, path=path)
        if conn.sock is not None:
            conn.sock.settimeout(deadline.wait_bound())
        try:
            piece = resp.read1(limit - got)
        except TimeoutError as exc:
            if deadline.expired():
                raise total_deadline_error(got, service=service, path=path) from exc
            raise
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    if resp.length == 0:
        # The whole Content-Length came; read1 leaves the answer open there (read
        # closes it): a complete listing page looked cut at its limit.
        resp.read()
    return b"".join(parts)


def request(pool: ConnectionPool, url: str, method: str, headers: Mapping[str, str],
            timeouts: Timeouts, *, path: str, service: str = "http",
            redirects: RedirectPolicy | None = None, cancel: Cancel | None = None,
            body_limit: int = _ERROR_BODY_LIMIT) -> Answer:
    """A small request (``HEAD``, a one-byte probe, a listing): the whole answer,
    its body capped at ``body_limit`` bytes; the connection is reused when the
    body was read to its end."""
    slot = enter_gate(URL(url, encoded=True), service=service, path=path, cancel=cancel)
    status: int | None = None
    try:
        conn, resp, view, final = send_request(pool, url, method, headers, timeouts, service=service,
                                        path=path, redirects=redirects, cancel=cancel)
        try:
            body = _small_body(conn, resp, body_limit, service=service, path=path)
        except BaseException:
            conn.close()
            raise
        status = resp.status
        complete = resp.isclosed()
        if complete and not resp.will_close:
            pool.release(origin_key(final), conn)
        else:
            conn.close()
        return Answer(resp.status, resp.reason, view, body, complete)
    except TensorstreamError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise exception_error(exc, path=path, received=0, service=service) from exc
    finally:
        slot.leave(status)
