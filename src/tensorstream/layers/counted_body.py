"""The range stream :class:`~tensorstream.layers.stack.PolicyProvider` hands out: its
reads counted in the metrics, bounded by the deadlines, their errors given context."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import TensorstreamError
from ..providers.base import BodyStream, Pin
from ..uri import redact_text
from . import timeout as _timeout

if TYPE_CHECKING:  # pragma: no cover
    from .stack import PolicyProvider

__all__ = ["CountedBody"]


class CountedBody:
    """A :class:`BodyStream` whose reads count in the metrics and whose errors
    name the service, operation and path."""

    def __init__(self, body: BodyStream, policy: PolicyProvider, path: str) -> None:
        self._body = body
        self._policy = policy
        self._path = path
        self._shown = redact_text(path)  # (once: every read names it to its deadline)

    @property
    def position(self) -> int:
        return self._body.position

    @property
    def end(self) -> int:
        return self._body.end

    @property
    def etag(self) -> str | None:
        """The ETag the answer was served under, where the provider tells it."""
        return getattr(self._body, "etag", None)

    @property
    def served(self) -> Pin | None:
        """The version the answer reported (ETag, Last-Modified, total), where
        the provider tells it: what lets a caller skip confirming the source
        again after the read (``cp`` did a HEAD per object without it)."""
        return getattr(self._body, "served", None)

    def readinto(self, buffer: memoryview) -> int:
        """The next ``len(buffer)`` bytes: one operation, bounded by the
        deadlines (the provider checks them between receives)."""
        return self._read(lambda: self._body.readinto(buffer))

    def readinto_parts(self, buffers: Sequence[memoryview]) -> int:
        """Fill each of ``buffers`` in turn: one operation (one receive where the
        provider's body can scatter, else one read per buffer); ``received`` on
        an error counts the valid bytes from the first buffer's start."""
        scatter = getattr(self._body, "readinto_parts", None)
        if scatter is not None:
            return self._read(lambda: int(scatter(buffers)))

        def each() -> int:
            done = 0
            for buffer in buffers:
                try:
                    done += self._body.readinto(buffer)
                except TensorstreamError as exc:
                    if hasattr(exc, "received"):
                        exc.received = done + int(exc.received or 0)
                    raise
            return done

        return self._read(each)

    def _read(self, read: Callable[[], int]) -> int:
        policy = self._policy
        timeouts = policy.config.timeouts
        try:
            n = _timeout.run_blocking(read, timeouts,
                                      _timeout.operation_deadline(timeouts),
                                      service=policy.service, path=self._shown)
        except TensorstreamError as exc:
            policy._add_context(exc, "read", self._path)
            raise
        self._policy.metrics.bytes_read += n
        return n

    def read_held(self, buffer: memoryview) -> bool:
        """Fill ``buffer`` only if its bytes have arrived (the provider's body
        never waits then, so no deadline applies); ``False``: nothing was read
        (the provider's body cannot tell, or the bytes have not arrived)."""
        held = getattr(self._body, "read_held", None)
        if held is None or not held(buffer):
            return False
        self._policy.metrics.bytes_read += len(buffer)
        return True

    def held(self) -> int:
        """Bytes :meth:`read_held` could serve now (0 where the provider's body
        cannot tell or never serves them)."""
        held = getattr(self._body, "held", None)
        return 0 if held is None else int(held())

    def available(self) -> int | None:
        """Bytes that have arrived and can be read without waiting, where the
        provider's body can tell (``None``: it cannot)."""
        available = getattr(self._body, "available", None)
        return None if available is None else int(available())

    def close(self) -> None:
        self._body.close()
