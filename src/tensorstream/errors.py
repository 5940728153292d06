"""tensorstream's exception hierarchy.

Every error tensorstream raises derives from :class:`TensorstreamError` *and*
from the builtin that fits, so ``except FileNotFoundError`` keeps working::

    TensorstreamError (Exception)
    ├── InvalidURIError            (ValueError)   malformed / unsupported URI
    ├── ConfigurationError         (ValueError)   bad or conflicting options
    │   └── MissingCredentialsError               lists every place it looked
    ├── UnknownSchemeError         (ValueError)   lists registered schemes
    ├── InvalidRangeError          (ValueError)   range outside the object
    ├── MalformedFileError         (ValueError)   a file's own structure is damaged
    │                                             (tensorizer index past the end,
    │                                             invalid safetensors header...)
    ├── NotFoundError              (FileNotFoundError)
    ├── PermissionDeniedError      (PermissionError)
    ├── UnsupportedOperationError  (io.UnsupportedOperation)
    ├── ObjectChangedError         (OSError)      ETag/version changed mid-read
    ├── ProtocolError              (OSError)      server broke the contract
    │                                             (ignored Range, wrong
    │                                             Content-Range, gzip body...)
    ├── IntegrityError             (OSError)      checksum mismatch
    ├── TransientError             (OSError)      *temporary*: retried
    │   ├── ConnectionFailedError  (ConnectionError)
    │   ├── ServiceUnavailableError               429 / 5xx / SlowDown
    │   └── IncompleteReadError                   body broken after N bytes
    ├── StorageTimeoutError        (TimeoutError) *temporary*: retried
    ├── RetriesExhaustedError      (OSError)      names operation + attempts
    │   └── RetriesExhaustedTimeoutError (TimeoutError) last attempt timed out
    └── LoadError                  (RuntimeError) torch/tensorizer failed loading
        ├── DistributedLoadError                  a rank of a group load failed
        │                                         or died (every rank raises it)
        └── InsufficientMemoryError (MemoryError) a file claims more than the
                                                  device holds (refused before
                                                  allocating)

Third-party exceptions chained to a tensorstream error (``__cause__``,
``__context__``) are replaced by an :class:`ExternalError` holding their type
name and their redacted message (``tensorstream._log_redaction.scrub_chain``):
aiohttp's and botocore's exceptions carry request URLs and headers, so a
presigned signature or an ``Authorization`` header would otherwise reach
tracebacks, ``repr`` and error reporters.

Errors carry ``service``, ``operation`` and ``path`` context (added by the
context layer, already redacted) and a ``temporary`` flag that the retry
layer reads. Messages never contain secrets: URIs are redacted before they
are put in a message.
"""

from __future__ import annotations

import io
from typing import Any

__all__ = [
    "ConfigurationError",
    "ConnectionFailedError",
    "DistributedLoadError",
    "ExternalError",
    "IncompleteReadError",
    "InsufficientMemoryError",
    "InsecureTLSWarning",
    "IntegrityError",
    "InvalidRangeError",
    "InvalidURIError",
    "LoadError",
    "MalformedFileError",
    "MissingCredentialsError",
    "NotFoundError",
    "ObjectChangedError",
    "PermissionDeniedError",
    "ProtocolError",
    "RetriesExhaustedError",
    "RetriesExhaustedTimeoutError",
    "ServiceUnavailableError",
    "StorageTimeoutError",
    "TensorstreamError",
    "TransientError",
    "UnknownSchemeError",
    "UnsupportedOperationError",
]


class TensorstreamError(Exception):
    """Base class of every tensorstream error."""

    #: True when retrying the same request may succeed.
    temporary: bool = False
    #: On a broken body: the version (a :class:`tensorstream.providers.base.Pin`)
    #: its bytes came from, so a resumed read is pinned to it (``None``: unknown).
    served: Any = None

    def __init__(
        self,
        message: str = "",
        *,
        service: str | None = None,
        operation: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.service = service
        self.operation = operation
        self.path = path

    def with_context(
        self, *, service: str | None = None, operation: str | None = None, path: str | None = None
    ) -> TensorstreamError:
        """Fill in context fields that are still empty; returns ``self``."""
        self.service = self.service or service
        self.operation = self.operation or operation
        self.path = self.path or path
        return self

    def __str__(self) -> str:
        parts = [p for p in (self.service, self.operation) if p]
        prefix = ""
        if parts:
            prefix = " ".join(parts)
            if self.path:
                prefix += f" {self.path}"
            prefix += ": "
        return prefix + self.message

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keep context across pickling (multiprocessing, pytest-xdist).
        return (
            _rebuild,
            (type(self), self.message, self.service, self.operation, self.path, self.__dict__),
        )


def _rebuild(cls, message, service, operation, path, state):  # type: ignore[no-untyped-def]
    obj = cls.__new__(cls)
    TensorstreamError.__init__(obj, message, service=service, operation=operation, path=path)
    obj.__dict__.update(state)
    return obj


class InvalidURIError(TensorstreamError, ValueError):
    """A URI could not be parsed or uses an unsupported form."""


class ConfigurationError(TensorstreamError, ValueError):
    """Options are invalid, unknown or contradict each other."""


class MissingCredentialsError(ConfigurationError):
    """No credentials were found; ``looked_in`` lists every place searched, ``advice``
    (after it) what to set."""

    def __init__(self, message: str, *, looked_in: list[str] | None = None,
                 advice: str | None = None, **context: str) -> None:
        self.looked_in = list(looked_in or [])
        if self.looked_in:
            message = f"{message} (looked in: {', '.join(self.looked_in)})"
        if advice:
            message = f"{message}; {advice}"
        super().__init__(message, **context)


class UnknownSchemeError(TensorstreamError, ValueError):
    """No provider is registered for a URI scheme."""


class InvalidRangeError(TensorstreamError, ValueError):
    """A requested byte range lies outside the object."""


class MalformedFileError(TensorstreamError, ValueError):
    """A file's own structure is damaged: a tensorizer index pointing past the end
    of the object, a header that does not parse, a safetensors header whose
    dtypes, shapes or offsets are invalid (raised before anything is allocated). ``expected_size`` (what the
    file's index needs, when known) and ``actual_size`` (the object's size)."""

    def __init__(self, message: str, *, expected_size: int | None = None,
                 actual_size: int | None = None, **context: str) -> None:
        super().__init__(message, **context)
        self.expected_size = expected_size
        self.actual_size = actual_size


class NotFoundError(TensorstreamError, FileNotFoundError):
    """The object (or bucket/key/path) does not exist."""


class PermissionDeniedError(TensorstreamError, PermissionError):
    """The backend refused the credentials or the operation."""


class UnsupportedOperationError(TensorstreamError, io.UnsupportedOperation):
    """The provider does not support this operation (see its capabilities)."""


class ObjectChangedError(TensorstreamError, OSError):
    """The object was replaced while it was being read."""


class ProtocolError(TensorstreamError, OSError):
    """The server answered in a way that could yield wrong bytes."""


class IntegrityError(TensorstreamError, OSError):
    """Bytes did not match their checksum."""


class TransientError(TensorstreamError, OSError):
    """A failure that may go away when retried."""

    temporary = True


class ConnectionFailedError(TransientError, ConnectionError):
    """Could not connect, or the connection was reset."""


class ServiceUnavailableError(TransientError):
    """The service asked us to slow down or failed (429, 5xx, SlowDown).

    ``adapting``: a throttle while the service answered other requests, so the
    client's width is adapting to it (the retry layer is more patient).
    ``not_applied``: the service said it turned the request away unapplied (a throttle
    in its own words, S3's ``SlowDown``), where a 5xx or a lost answer leaves it open."""

    def __init__(self, message: str, *, retry_after: float | None = None, **context: str) -> None:
        super().__init__(message, **context)
        self.retry_after = retry_after
        self.adapting = False
        self.not_applied = False


class IncompleteReadError(TransientError):
    """A body ended early. ``received`` bytes at the start of the buffer are valid.

    The retry layer resumes from ``offset + received`` instead of starting over.
    """

    def __init__(self, message: str, *, received: int, **context: str) -> None:
        super().__init__(message, **context)
        self.received = received


class StorageTimeoutError(TensorstreamError, TimeoutError):
    """A connect, idle (time-between-bytes) or total timeout expired.

    ``timeout`` says which (``"connect"``, ``"idle"``, ``"total"``; ``None`` when
    not known): the retry layer then adds the option, its value and what to
    raise it to (:func:`tensorstream.layers.timeout.advise`)."""

    temporary = True
    #: Whether that advice is in the message already.
    advised = False

    def __init__(self, message: str, *, received: int = 0, timeout: str | None = None,
                 **context: str) -> None:
        super().__init__(message, **context)
        self.received = received
        self.timeout = timeout


class RetriesExhaustedError(TensorstreamError, OSError):
    """Gave up after ``attempts`` tries; ``last_error`` is the final failure."""

    def __init__(self, message: str, *, attempts: int, last_error: BaseException | None = None,
                 **context: str) -> None:
        super().__init__(message, **context)
        self.attempts = attempts
        self.last_error = last_error


class RetriesExhaustedTimeoutError(RetriesExhaustedError, TimeoutError):
    """Gave up after retries whose last failure was a timeout (also a ``TimeoutError``)."""

    temporary = False


class LoadError(TensorstreamError, RuntimeError):
    """torch or tensorizer failed while loading (out of memory, an unsupported
    dtype...); the message names the file and what to try, the original
    exception is chained as ``__cause__``. Also importable from
    ``tensorstream.tensorizer``."""


class DistributedLoadError(LoadError):
    """A load shared by a ``torch.distributed`` group (``group=``) failed on some rank.

    Raised on *every* rank of the group, so no rank waits forever for a peer
    and none hands out a partially filled tensor. ``failed_ranks`` lists the
    ranks that failed (empty when a collective itself broke: a rank died or
    did not answer within the timeout); ``errors`` maps each failed rank to
    its redacted error text. This rank's own failure, if any, is chained as
    ``__cause__``.
    """

    def __init__(self, message: str, *, failed_ranks: list[int] | None = None,
                 errors: dict[int, str] | None = None, **context: str) -> None:
        super().__init__(message, **context)
        self.failed_ranks = list(failed_ranks or [])
        self.errors = dict(errors or {})


class InsufficientMemoryError(LoadError, MemoryError):
    """A file's tensors claim more bytes than the device can hold; raised before
    any of them is allocated. ``claimed`` (the bytes the tensors to load would
    take) and ``limit`` (what the device has available, or the allowance
    passed as ``max_tensor_bytes``)."""

    def __init__(self, message: str, *, claimed: int, limit: int, **context: str) -> None:
        super().__init__(message, **context)
        self.claimed = claimed
        self.limit = limit


class ExternalError(Exception):
    """Stands in for a third-party exception in the chain of a tensorstream error.

    ``str()`` is ``"<module>.<type>: <redacted message>"``; ``original_type``
    names the type. The traceback is the original one (its frames, not its
    values). Not a :class:`TensorstreamError`: it is never raised by itself.
    """

    def __init__(self, original_type: str, message: str) -> None:
        super().__init__(f"{original_type}: {message}")
        self.original_type = original_type
        self.original_message = message

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.original_type, self.original_message))


class InsecureTLSWarning(UserWarning):
    """TLS certificate verification was turned off with ``insecure=True``."""
