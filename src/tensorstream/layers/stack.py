"""Policies written once and wrapped around any provider.

:class:`PolicyProvider` adds, to every backend alike:

* **context** -- service, operation and (redacted) path on every error;
* **retry** -- jittered exponential backoff (tenacity, :mod:`.retrying`) on errors marked
  ``temporary`` only, honouring ``Retry-After``; never on 4xx-like errors; listings are
  listed again (:mod:`.listing`);
* **resume** -- a body broken after ``k`` bytes continues at ``offset + k``
  instead of starting over;
* **timeouts** -- total and idle deadlines inside every attempt
  (:mod:`tensorstream.layers.timeout`);
* **pinning** -- reads of one object are pinned to one version (ETag, else
  Last-Modified, and size); a change raises :class:`ObjectChangedError`, never
  a mix of versions (:mod:`tensorstream.layers.pinning`);
* **capabilities** -- an operation the provider does not declare fails here,
  with one message;
* **metrics** -- bytes, requests, retries.

The wrapper forwards every :class:`Provider` method explicitly (a test checks
that nothing is silently inherited). The range stream and the writer it hands out
are in :mod:`.counted_body` and :mod:`.context_writer`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from .. import _loop
from .._log_redaction import mask_secrets, scrub_chain
from ..config import CommonConfig
from ..errors import (
    RetriesExhaustedError,
    RetriesExhaustedTimeoutError,
    StorageTimeoutError,
    TensorstreamError,
    UnsupportedOperationError,
)
from ..providers.base import BodyStream, ObjectInfo, Pin, Provider, Writer
from . import timeout as _timeout
from .context_writer import ContextWriter
from .counted_body import CountedBody
from .pinning import resume_pin

__all__ = ["Metrics", "PolicyProvider"]

log = logging.getLogger("tensorstream.layers.stack")
T = TypeVar("T")


@dataclasses.dataclass
class Metrics:
    """Counters for one provider instance."""

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    resumed_bytes: int = 0


def _is_temporary(exc: BaseException) -> bool:
    return bool(getattr(exc, "temporary", False))


def _as_pin(pin: Pin | None, etag: str | None) -> Pin | None:
    if pin is None and etag is not None:
        return Pin(etag=etag)
    return pin


class PolicyProvider(Provider):
    """Wrap ``inner`` with context, retry, resume, timeouts, pinning and metrics."""

    def __init__(self, inner: Provider, config: CommonConfig) -> None:
        self.inner = inner
        self.config = config
        self.metrics = Metrics()
        self.service = inner.service  # type: ignore[misc]
        caps = inner.capabilities
        self._pins = caps.pinned_reads
        if not caps.pinned_reads and caps.range_streams:
            # A stream's reads cannot be checked one by one without a stat per
            # read: providers that cannot pin are read by (checked) ranges.
            caps = dataclasses.replace(caps, range_streams=False)
        self.capabilities = caps  # type: ignore[misc]
        self.read_hints = inner.read_hints  # type: ignore[misc]
        self.schemes = inner.schemes  # type: ignore[misc]
        self.unsupported_advice = inner.unsupported_advice  # type: ignore[misc]
        self.shown_origin = inner.shown_origin

    def __repr__(self) -> str:
        return f"PolicyProvider({self.inner!r})"

    def shown_path(self, path: str) -> str:
        return self.inner.shown_path(path)

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> Provider:  # pragma: no cover - not used
        raise TypeError("PolicyProvider wraps a provider; use tensorstream.get_provider")

    # -- machinery ----------------------------------------------------------
    def _retrying(self, blocking: bool = False, at: float | None = None) -> Any:
        # Imported here: only a call that failed once gets this far (tenacity's
        # import is not paid by a process whose requests all succeed).
        from .retrying import retrying

        return retrying(self.config.retry, self.config.timeouts.total, retry_if=_is_temporary,
                        before_sleep=self._log_retry, blocking=blocking, at=at)

    def _log_retry(self, state: Any) -> None:
        self.metrics.retries += 1
        exc = state.outcome.exception() if state.outcome else None
        sleep = state.next_action.sleep if state.next_action else 0.0
        # Masked as the final error is: a server may echo a token in its reason phrase.
        log.debug(
            "%s: attempt %d failed (%s); retrying in %.2fs",
            self.service,
            state.attempt_number,
            mask_secrets(f"{type(exc).__name__}: {exc}"),
            sleep,
        )

    async def _call(self, operation: str, path: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` under the policy: deadlines, retries of temporary errors with
        backoff, error context. The first attempt runs outside the retry loop (nearly
        every call succeeds at once, and building a loop per call cost more than a
        local read itself); its temporary failure enters the loop as its first
        attempt, judged and waited on exactly as if the loop had run it."""
        timeouts = self.config.timeouts
        at = _timeout.operation_deadline(timeouts)
        shown = self.inner.shown_path(path)
        attempts = 1
        try:
            try:
                self.metrics.requests += 1
                return await _timeout.run_async(fn, timeouts, at, service=self.service, path=shown)
            except Exception as exc:  # (the loop's own test: anything temporary is retried)
                if not _is_temporary(exc):
                    raise
                first: Exception | None = exc
            async for attempt in self._retrying(at=at):
                with attempt:
                    if first is not None:
                        failed, first = first, None
                        raise failed
                    attempts += 1
                    self.metrics.requests += 1
                    return await _timeout.run_async(fn, timeouts, at, service=self.service,
                                                    path=shown)
        except TensorstreamError as exc:
            final = self._final_error(exc, operation, path, attempts)
            if final is exc:
                raise
            raise final from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _call_blocking(self, operation: str, path: str, fn: Callable[[], T]) -> T:
        """:meth:`_call` for blocking operations (worker threads): same policy."""
        timeouts = self.config.timeouts
        at = _timeout.operation_deadline(timeouts)
        shown = self.inner.shown_path(path)
        attempts = 1
        try:
            try:
                self.metrics.requests += 1
                return _timeout.run_blocking(fn, timeouts, at, service=self.service, path=shown)
            except Exception as exc:  # (the loop's own test: anything temporary is retried)
                if not _is_temporary(exc):
                    raise
                first: Exception | None = exc
            for attempt in self._retrying(blocking=True, at=at):
                with attempt:
                    if first is not None:
                        failed, first = first, None
                        raise failed
                    attempts += 1
                    self.metrics.requests += 1
                    return _timeout.run_blocking(fn, timeouts, at, service=self.service,
                                                 path=shown)
        except TensorstreamError as exc:
            final = self._final_error(exc, operation, path, attempts)
            if final is exc:
                raise
            raise final from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _final_error(
        self, exc: TensorstreamError, operation: str, path: str, attempts: int
    ) -> TensorstreamError:
        """The error to raise once retrying stopped: ``exc`` with context, or a
        :class:`RetriesExhaustedError` naming the attempts when it was temporary."""
        self._add_context(exc, operation, path)
        if not (exc.temporary and attempts > 1):
            return exc
        cls = RetriesExhaustedTimeoutError if isinstance(exc, TimeoutError) else RetriesExhaustedError
        final = cls(
            f"gave up after {attempts} attempts: {type(exc).__name__}: {exc.message}",
            attempts=attempts,
            last_error=exc,
            service=self.service,
            operation=operation,
            path=exc.path or self.inner.shown_path(path),
        )
        return final

    def _add_context(self, exc: TensorstreamError, operation: str, path: str) -> None:
        exc.with_context(service=self.service, operation=operation,
                         path=self.inner.shown_path(path))
        origin = self.inner.shown_origin
        if origin and exc.path and exc.path.startswith("/"):
            # (here once for every error: "http stat /k" said which object, not which server)
            exc.path = origin + exc.path
        if isinstance(exc, StorageTimeoutError):
            _timeout.advise(exc, self.config.timeouts)
        # Every provider error leaves through here: strip secrets from its chain
        # (third-party causes hold request URLs and Authorization headers).
        scrub_chain(exc)

    def _unsupported(self, operation: str, flag: str) -> UnsupportedOperationError:
        """The one error for an operation the provider does not declare: in its own
        words where it has them (HTTP(S): what to use instead)."""
        advice = self.inner.unsupported_advice.get(flag)
        return UnsupportedOperationError(
            advice or f"{self.service} does not support {operation} "
            f"(its capabilities do not declare {flag})",
            service=self.service, operation=operation)

    # -- forwarded operations -----------------------------------------------
    async def stat(self, path: str) -> ObjectInfo:
        return await self._call("stat", path, lambda: self.inner.stat(path))

    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None,
        etag: str | None = None,
    ) -> int:
        """Fill ``buffer`` exactly, retrying temporary errors and resuming broken
        bodies, every answer of the version ``pin`` (or the one ``etag`` names)."""
        if len(buffer) == 0:
            return 0
        pin = _as_pin(pin, etag)
        if not self._pins and (pin is None or pin.size is None):
            pin = Pin.of(await self.stat(path))  # the version the check after compares
        state = _Resume(self, path, offset, buffer, pin)

        async def attempt() -> int:
            view, at, pinned = state.next_attempt()
            try:
                if self._pins:
                    n = await self.inner.readinto(path, at, view, pin=pinned)
                else:
                    n = await self.inner.readinto(path, at, view)
            except TensorstreamError as exc:
                state.failed(exc)
                raise
            return state.succeeded(n, view)

        n = await self._call("read", path, attempt)
        if not self._pins:
            await self._check_after(path, state.pin)
        self.metrics.bytes_read += n
        return n

    def readinto_blocking(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None,
        etag: str | None = None,
    ) -> int:
        """:meth:`readinto` on the provider's blocking data path (worker threads)."""
        if not self.capabilities.blocking_reads:
            raise self._unsupported("blocking reads", "blocking_reads")
        if len(buffer) == 0:
            return 0
        pin = _as_pin(pin, etag)
        if not self._pins and (pin is None or pin.size is None):
            pin = Pin.of(_loop.run_sync(self.stat(path)))
        state = _Resume(self, path, offset, buffer, pin)

        def attempt() -> int:
            view, at, pinned = state.next_attempt()
            try:
                if self._pins:
                    n = self.inner.readinto_blocking(path, at, view, pin=pinned)
                else:
                    n = self.inner.readinto_blocking(path, at, view)
            except TensorstreamError as exc:
                state.failed(exc)
                raise
            return state.succeeded(n, view)

        n = self._call_blocking("read", path, attempt)
        if not self._pins:
            _loop.run_sync(self._check_after(path, state.pin))
        self.metrics.bytes_read += n
        return n

    async def _check_after(self, path: str, pin: Pin | None) -> None:
        """Pin by stat for providers that cannot pin: the object must still be
        the version the read started on."""
        if pin is not None:
            info = await self.stat(path)
            pin.check(Pin.of(info), service=self.service, path=self.inner.shown_path(path))

    def open_range_blocking(
        self, path: str, start: int, end: int, *, pin: Pin | None = None,
        etag: str | None = None,
    ) -> BodyStream:
        """The provider's range stream, opened under the retry policy. Its reads
        are counted, bounded by the deadlines, and their errors carry context; a
        stream broken part-way is not resumed here: the caller reads the rest
        with :meth:`readinto_blocking` (which retries and resumes)."""
        if not self.capabilities.range_streams:
            raise self._unsupported("range streams", "range_streams (and pinned_reads)")
        pinned = _as_pin(pin, etag)
        body = self._call_blocking(
            "read", path, lambda: self.inner.open_range_blocking(path, start, end, pin=pinned))
        return CountedBody(body, self, path)

    def open_whole_blocking(self, path: str) -> tuple[ObjectInfo, BodyStream] | None:
        """The provider's size, validators and stream of every byte from one
        request, under the retry policy; ``None`` when it has none to give (the
        caller then asks :meth:`stat`)."""
        caps = self.capabilities
        if not (caps.range_streams and caps.blocking_reads and self.config.transfer.stream_reads):
            return None  # the body would not be read as a stream
        got = self._call_blocking("stat", path, lambda: self.inner.open_whole_blocking(path))
        if got is None:
            return None
        info, body = got
        return info, CountedBody(body, self, path)

    async def read_range(
        self, path: str, start: int, end: int, *, pin: Pin | None = None,
        etag: str | None = None,
    ) -> bytes:
        return await Provider.read_range(self, path, start, end, pin=_as_pin(pin, etag))

    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        if not self.capabilities.list:
            raise self._unsupported("list", "list")
        return self._list(prefix)

    def list_level(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """One level under ``prefix``, for a provider that lists by delimiter (S3's
        ``list_level``): its objects, and each deeper prefix once (a path ending in
        ``/``). Others raise :class:`UnsupportedOperationError`; :meth:`list` them."""
        level = getattr(self.inner, "list_level", None)
        if not self.capabilities.list or level is None:
            raise self._unsupported("list_level", "list")
        return self._list(prefix, level)

    async def _list(self, prefix: str, lister: Any = None) -> AsyncIterator[ObjectInfo]:
        from .listing import retried_listing  # (its module: stack.py is long enough)

        def final(exc: TensorstreamError, attempts: int) -> TensorstreamError:
            return self._final_error(exc, "list", prefix, attempts)

        def on_retry(exc: TensorstreamError) -> None:
            self.metrics.retries += 1
            log.debug("%s: listing %s failed (%s); listing again", self.service,
                      self.inner.shown_path(prefix), mask_secrets(f"{type(exc).__name__}: {exc}"))

        # (a provider may list some prefixes in no order, where StartAfter cannot resume:
        # an S3 directory bucket, a store found listing in an order of its own; those
        # are listed from the start again: asked at each retry)
        ordered = getattr(self.inner, "lists_in_order", None)

        def resumes() -> bool:
            return getattr(self.inner, "resumes_listing", False) is True and (
                ordered is None or ordered(prefix) is True)

        def start(after: str | None) -> AsyncIterator[ObjectInfo]:
            list_: Any = lister or self.inner.list  # (start_after: resumes_listing's)
            return list_(prefix, start_after=after) if after is not None else list_(prefix)

        try:
            async for info in retried_listing(start, self.config.retry, self.config.timeouts,
                                              final=final, on_retry=on_retry,
                                              resumes=resumes):
                yield info
        except TensorstreamError as exc:
            self._add_context(exc, "list", prefix)
            raise

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        if not self.capabilities.write:
            raise self._unsupported("writes", "write")
        try:
            return ContextWriter(self.inner.open_writer(path, **kwargs), self, path)
        except TensorstreamError as exc:
            self._add_context(exc, "write", path)
            raise

    async def delete(self, path: str) -> None:
        if not self.capabilities.delete:
            raise self._unsupported("delete", "delete")
        await self._call("delete", path, lambda: self.inner.delete(path))

    async def close(self) -> None:
        await self.inner.close()

    async def stat_pinned(self, path: str, pin: Pin | str | None) -> ObjectInfo:
        """``stat`` that raises :class:`ObjectChangedError` if the object is no
        longer the version ``pin`` (a :class:`Pin`, or an ETag)."""
        info = await self.stat(path)
        if isinstance(pin, str):
            pin = Pin(etag=pin)
        if pin is not None:
            pin.check(Pin.of(info), service=self.service, path=self.inner.shown_path(path))
        return info


class _Resume:
    """Progress of one exact read across attempts: where to resume and which
    version to pin to. Shared by the async and the blocking path."""

    def __init__(self, owner: PolicyProvider, path: str, offset: int, buffer: memoryview,
                 pin: Pin | None) -> None:
        self.owner = owner
        self.path = path
        self.offset = offset
        self.buffer = buffer
        self.done = 0
        self.pin = pin

    def next_attempt(self) -> tuple[memoryview, int, Pin | None]:
        return self.buffer[self.done :], self.offset + self.done, self.pin

    def failed(self, exc: TensorstreamError) -> None:
        received = int(getattr(exc, "received", 0) or 0)
        if received and exc.temporary:
            # Resume only from the same version of the object: pinned to the
            # version the broken answer was served under. Bytes whose version
            # cannot be told apart from another are dropped (the read starts over).
            pin = resume_pin(self.pin, exc)
            if pin is None:
                return
            self.pin = pin
            self.done += received
            self.owner.metrics.resumed_bytes += received

    def succeeded(self, n: int, view: memoryview) -> int:
        if n != len(view):
            raise AssertionError(f"provider {self.owner.service} returned {n} of {len(view)} bytes")
        self.done = len(self.buffer)
        return self.done
