"""Keep secrets out of third-party DEBUG logs, and out of what a server echoes.

botocore logs canonical requests and request headers at DEBUG, including
``X-Amz-Security-Token`` and the ``Authorization`` signature. A filter on
those loggers masks them before any handler sees the record.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import traceback
from collections.abc import Iterable

from .errors import ExternalError, TensorstreamError
from .uri import redact_text
from .uri_redaction import SECRET_API_PARAMS, SECRET_HEADERS, secret_query_values

__all__ = ["install_secret_filter", "mask_secrets", "register_query_secrets", "register_secret",
           "scrub_chain", "withhold",
           "withhold_args"]

#: Shorter secrets are not masked: masking every "a" of a one-letter password hides the text.
_MIN_SECRET = 4


def withhold(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every known secret in it (a password, a secret key, a
    session token that a server echoed back) masked as ``***``."""
    for secret in secrets:
        if secret and len(secret) >= _MIN_SECRET:
            text = text.replace(secret, "***")
    return text


def withhold_args(exc: BaseException, secrets: tuple[str, ...]) -> None:
    """Mask ``secrets`` in ``exc``'s string arguments in place: it stays chained
    as the cause of the error raised instead, and tracebacks print it."""
    if secrets:
        exc.args = tuple(withhold(a, secrets) if isinstance(a, str) else a for a in exc.args)


#: Secret headers whose values hold spaces (``Bearer ...``, ``a=1; b=2``): masked to the
#: end of their line. The others' values are tokens (base64).
_LINE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


def _header_pattern(names: Iterable[str], value: str) -> re.Pattern[str]:
    """A header dump's ``'Name': b'value'`` / ``name:value`` (canonical request) /
    ``Name: value``, for any of ``names`` (longest first: one is another's head)."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?i)((?:{alternatives})['\"]?\s*[:=]\s*(?:b?['\"])?)({value})")


_PATTERNS = [
    # header dumps of SECRET_HEADERS (the one list). A token is base64: it ends at a '&',
    # ';' or ':', and what follows stays (``?...Token=***&v=3: why``).
    _header_pattern(SECRET_HEADERS - _LINE_HEADERS, r"[^'\"\s,}&;:]+"),
    # (to the end of its line: 'Authorization: Bearer ...' took every line up to a quote)
    _header_pattern(_LINE_HEADERS, r"[^'\"}\r\n]+"),
    re.compile(r"(?i)(signature=)([0-9a-f]{16,})"),
    re.compile(r"(?i)(aws_secret_access_key['\"]?\s*[:=]\s*['\"]?)([^'\"\s,}]+)"),
    # botocore's parameters dump (a value as given may be any bytes: a quoted literal whole)
    re.compile(r"((?:" + "|".join(sorted(SECRET_API_PARAMS, key=len, reverse=True))
               + r")['\"]?\s*[:=]\s*)"
               + r"(b?'(?:[^'\\\n]|\\.)*'|b?\"(?:[^\"\\\n]|\\.)*\"|[^'\"\s,}]+)"),
]


#: Secrets in use in this process (see :func:`register_secret`), newest last: credentials.
_REGISTERED: dict[str, None] = {}
#: The most remembered: the oldest are forgotten first.
_MAX_REGISTERED = 256
#: Values a single request carried (a presigned URL's signature), newest (or last sent)
#: last, kept apart: a long run over many presigned URLs forgot the credentials (a Redis
#: password, an S3 secret key) registered at its start, the oldest, when they shared one
#: bounded list.
_PER_REQUEST: dict[str, None] = {}
_MAX_PER_REQUEST = 256
#: Shorter values are not remembered: masking a common word everywhere hides text.
_MIN_REGISTERED = 8
#: Registration runs on many threads (one per read): the oldest's eviction is not atomic.
#: Re-entrant: a log record made while it is held (a finalizer the collector runs there,
#: aiohttp's "Unclosed client session") is masked under it, on the same thread.
_REGISTRY_LOCK = threading.RLock()


def register_secret(value: str, *, per_request: bool = False) -> None:
    """Remember ``value`` (a password, secret key, token, ``Authorization`` value) so
    that third-party log records and error chains mask it wherever it turns up: a
    server or a client library may echo what it was sent (redis-py logs the error
    reply to ``AUTH``, which a proxy may have filled with the password).

    ``per_request``: a value one request carries (a presigned query's signature), kept
    among the most recently sent ones, never displacing a credential."""
    values = [value]
    scheme, _, rest = value.partition(" ")
    if scheme.lower() in ("bearer", "basic") and rest:
        values.append(rest)  # the token (or base64 user:password) alone
    registry, most = (_PER_REQUEST, _MAX_PER_REQUEST) if per_request else (
        _REGISTERED, _MAX_REGISTERED)
    with _REGISTRY_LOCK:
        for v in values:
            if len(v) < _MIN_REGISTERED:
                continue
            registry.pop(v, None)  # sent again: the newest (the one still in use is kept)
            registry[v] = None
            while len(registry) > most:
                del registry[next(iter(registry))]
    install_secret_filter()


def register_query_secrets(target: str) -> None:
    """Remember the values an HTTP(S) request's query sends (``target``: a URL or
    ``/path?query``; a presigned URL's signature, a token under any name) as
    :func:`register_secret` ``per_request`` does: a server may echo one alone (its reason
    phrase), where no name says so. Called for each request sent, and for each redirect
    target (a presigned URL behind a redirect, as model hubs send)."""
    for value in secret_query_values(target, every_name=True):
        register_secret(value, per_request=True)


def _after_fork_in_child() -> None:
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.RLock()  # another thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def _mask(text: str) -> str:
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    if _REGISTERED or _PER_REQUEST:
        with _REGISTRY_LOCK:
            known = (*_REGISTERED, *_PER_REQUEST)
        # longest first: a value that contains another is masked whole
        text = withhold(text, tuple(sorted(known, key=len, reverse=True)))
    return redact_text(text)


mask_secrets = _mask

#: A chain deeper than this is cut (a cycle guard as well).
_MAX_CHAIN = 32
#: Third-party messages longer than this are cut (a body dump is not a message).
_MAX_MESSAGE = 2000


def _stand_in(exc: BaseException) -> ExternalError:
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        text = str(exc)
    except Exception:  # pragma: no cover - a broken __str__
        text = "<unprintable>"
    # Masked whole, then cut: a cut made first could fall inside a secret, whose head then
    # matched nothing and was shown.
    text = _mask(text)
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + "..."
    out = ExternalError(kind, text)
    out.__traceback__ = exc.__traceback__
    return out


def scrub_chain(exc: BaseException) -> BaseException:
    """Make ``exc`` and everything chained to it safe to print.

    The one translation point for secrets in exception chains: every
    third-party exception in ``__cause__``/``__context__`` (and in a
    :class:`RetriesExhaustedError`'s ``last_error``) is replaced by an
    :class:`ExternalError` with its type and masked message (aiohttp's
    ``ClientResponseError`` holds the request URL and headers, so its
    ``repr`` shows a presigned signature and the ``Authorization`` header);
    tensorstream errors' own messages are masked again. Idempotent; returns
    ``exc`` (changed in place) or its stand-in when it is third-party itself.
    """
    done: dict[int, BaseException] = {}

    def clean(e: BaseException | None, depth: int) -> BaseException | None:
        if e is None:
            return None
        if id(e) in done:
            return done[id(e)]
        if depth > _MAX_CHAIN:
            return None
        if isinstance(e, TensorstreamError | ExternalError):
            out: BaseException = e
            if isinstance(e, TensorstreamError):
                e.message = _mask(e.message)
                e.path = _mask(e.path) if e.path else e.path
                e.args = (e.message,)
        else:
            out = _stand_in(e)
        done[id(e)] = out
        suppress = e.__suppress_context__
        cause = clean(e.__cause__, depth + 1)
        context = clean(e.__context__, depth + 1)
        out.__cause__, out.__context__ = cause, context
        out.__suppress_context__ = suppress  # setting __cause__ turned it on
        last = getattr(e, "last_error", None)
        if isinstance(last, BaseException):
            out.last_error = clean(last, depth + 1)  # type: ignore[attr-defined]
        return out

    return clean(exc, 0) or exc


#: Loggers whose exceptions may quote what a credential source printed (botocore
#: logs a failed refresh of a ``credential_process``'s keys as a WARNING with its
#: traceback): the traceback is kept, the messages are withheld.
_CREDENTIAL_LOGGERS = ("botocore.credentials", "aiobotocore.credentials", "botocore.tokens",
                       "aiobotocore.tokens")


def _exception_text(record: logging.LogRecord) -> str:
    """The record's traceback, safe to print (see :class:`SecretFilter`)."""
    assert record.exc_info is not None
    kind, exc, tb = record.exc_info
    if record.name.startswith(_CREDENTIAL_LOGGERS):
        name = f"{kind.__module__}.{kind.__qualname__}" if kind else "exception"
        return ("Traceback (most recent call last):\n" + "".join(traceback.format_tb(tb))
                + f"{name}: (message withheld: it may quote what a credential source printed)")
    return _mask("".join(traceback.format_exception(kind, exc, tb)).rstrip("\n"))


class SecretFilter(logging.Filter):
    """Render the record once and mask credentials in it, its traceback too
    (as ``exc_text``, which formatters print instead of formatting ``exc_info``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            try:
                text = _exception_text(record)
            except Exception:  # pragma: no cover - an exception that cannot be printed
                text = "(traceback withheld)"
            record.exc_text, record.exc_info = text, None
        try:
            message = record.getMessage()
        except Exception:  # pragma: no cover - malformed third-party record
            return True
        masked = _mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_installed = False
_LOGGERS = ("botocore", "aiobotocore", "s3fs", "urllib3", "aiohttp", "redis", "asyncio", "fsspec")


def install_secret_filter() -> None:
    """Mask credentials in every log record of the libraries we drive (idempotent).

    A ``logging.Filter`` on a logger does not see records of its child loggers
    (``botocore.auth``, ``botocore.endpoint``, ...), so the masking hooks the
    record factory, the supported place to adjust records as they are made.
    """
    global _installed
    if _installed:
        return
    _installed = True
    flt = SecretFilter()
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.startswith(_LOGGERS):
            flt.filter(record)
        return record

    logging.setLogRecordFactory(factory)
