"""The one mapping of an HTTP status or a transport exception (http.client, ssl,
OS) to a tensorstream error, shared by the HTTP and S3 providers."""

from __future__ import annotations

import asyncio
import http.client
import ssl

from ..._client_cert import client_cert_advice, client_cert_answer
from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    IncompleteReadError,
    InvalidRangeError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    ProtocolError,
    ServiceUnavailableError,
    StorageTimeoutError,
    TensorstreamError,
)
from ...uri import redact, redact_text
from .header_values import Headers, parse_content_range, parse_retry_after

__all__ = [
    "CREDENTIALS_DROPPED",
    "DROPPED_NOTE",
    "bad_request_advice",
    "exception_error",
    "plain_text_answer",
    "redact_path",
    "status_error",
]


def redact_path(path: str) -> str:
    """``/path?query`` with secret query parameters (presigned URLs) redacted."""
    return redact("http://h" + path)[len("http://h") :]


#: Set (True) on an answer's headers when credentials were dropped on the way to it.
CREDENTIALS_DROPPED = "credentials_dropped"
#: What a refusal after such a redirect says (the provider then names no source as sent).
DROPPED_NOTE = ("after a redirect to another origin (scheme, host or port), where "
                "credentials are never sent")


#: nginx's 400 page for a plain HTTP request to its TLS port.
_NGINX_PLAIN_TO_TLS = "The plain HTTP request was sent to HTTPS port"


def bad_request_advice(body: bytes) -> str | None:
    """What a 400 page of nginx's own says to do (a client certificate it requires,
    plain HTTP to its TLS port), or ``None``. Only its fixed phrases are matched: no
    other text of a body reaches a message."""
    advice = client_cert_answer(body)
    if advice is None and _NGINX_PLAIN_TO_TLS.lower() in body[:4096].decode("latin-1").lower():
        advice = (f"the port speaks TLS (nginx: '{_NGINX_PLAIN_TO_TLS}'): use https:// "
                  "instead of http://")
    return advice


def status_error(status: int, reason: str, headers: Headers, *, path: str,
                 service: str = "http", body: bytes = b"") -> TensorstreamError:
    """The tensorstream error for an HTTP status that is not the expected answer
    (``body``: the start of the answer's body, for the advice of nginx's 400 pages)."""
    where = {"service": service, "path": redact_path(path)}
    # (cut: the reason phrase is the server's text, up to a 64 KiB status line)
    msg = f"HTTP {status} {_cut(reason or '')}".rstrip()
    if status == 400 and (advice := bad_request_advice(body)) is not None:
        return ConfigurationError(f"{msg}: {advice}", **where)
    if status in (404, 410):
        return NotFoundError(f"{msg}: no such object", **where)
    if status in (401, 403):
        if getattr(headers, CREDENTIALS_DROPPED, False):
            msg += (f": access refused {DROPPED_NOTE}; pass the URL the server redirects to, "
                    "with the credentials for it")
            return PermissionDeniedError(msg, **where)
        return PermissionDeniedError(f"{msg}: access refused", **where)
    if status == 412:
        return ObjectChangedError(f"{msg}: the object changed (the pinned read's precondition "
                                  "failed)", **where)
    if status == 416:
        total = parse_content_range(headers.get("Content-Range"))
        size = f" of a {total.total}-byte object" if total and total.total is not None else ""
        return InvalidRangeError(f"{msg}: range past the end{size}", **where)
    if status in (408, 429) or (500 <= status < 600 and status not in (501, 505)):
        return ServiceUnavailableError(
            msg, retry_after=parse_retry_after(headers.get("Retry-After")), **where
        )
    if 400 <= status < 500:
        return ConfigurationError(f"{msg}: the server rejected the request", **where)
    return ProtocolError(f"unexpected {msg}", **where)


def exception_error(exc: BaseException, *, path: str, received: int = 0,
                    service: str = "http") -> TensorstreamError:
    """The tensorstream error for a transport exception (http.client, ssl, OS).

    ``received`` body bytes already landed make a broken connection a
    resumable :class:`IncompleteReadError`.
    """
    if isinstance(exc, TensorstreamError):
        return exc
    where = {"service": service, "path": redact_path(path)}
    # Cut: http.client quotes a bad status line whole (up to 64 KiB of a body).
    what = f"{type(exc).__name__}: {_cut(redact_text(str(exc)))}"
    if isinstance(exc, ssl.SSLError) and plain_text_answer(exc):
        err: TensorstreamError = ConnectionFailedError(
            f"the server answered in plain text, not TLS ({what}): use http:// instead of "
            "https://", **where)
        err.temporary = False
        return err
    if isinstance(exc, ssl.SSLError):
        advice = client_cert_advice(exc)
        err = ConnectionFailedError(
            f"TLS failed ({what}); " + (advice or "for a private CA pass ca_bundle=<PEM path> "
                                        "(insecure=True skips verification)"), **where)
        err.temporary = False  # an untrusted certificate does not fix itself
        return err
    # socket.timeout is TimeoutError; asyncio's is too only from Python 3.11 on.
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return StorageTimeoutError(f"timed out after {received} bytes", received=received,
                                   timeout="idle", **where)
    if received and isinstance(exc, (http.client.IncompleteRead, OSError)):
        return IncompleteReadError(f"body broken after {received} bytes ({what})",
                                   received=received, **where)
    if isinstance(exc, http.client.IncompleteRead):
        return IncompleteReadError(f"body broken ({what})", received=0, **where)
    if isinstance(exc, OSError):
        # includes http.client.RemoteDisconnected (a ConnectionResetError)
        return ConnectionFailedError(f"connection failed ({what})", **where)
    return ProtocolError(f"HTTP client error ({what})", **where)


def _cut(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


#: What OpenSSL says when the "TLS" server answered with plain text (an HTTP port).
_PLAIN_TEXT_MARKERS = ("WRONG_VERSION_NUMBER", "wrong version number", "record layer failure",
                       "http request", "packet length too long")


def plain_text_answer(exc: BaseException) -> bool:
    """Whether a TLS error means the server spoke plain text (https:// to an http:// port)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if any(m in str(cur) for m in _PLAIN_TEXT_MARKERS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
