"""Listings retried as reads are (:meth:`PolicyProvider.list
<tensorstream.layers.stack.PolicyProvider.list>`).

A listing is a series of requests (S3 ``ListObjectsV2`` pages, Redis ``SCAN``s)
made inside the provider's iterator, out of the retry layer's reach: one page
that stalled or was throttled failed the whole ``ls``, ``cp -r`` or ``sync``.
Listing is idempotent, so a listing that fails with a temporary error is listed
again with backoff, under the same attempt budget as a read (counted again from
each new entry) and, as a read, within ``timeout_total`` of the step's start, its
retries and their waits included (a wait that would end past it is not waited:
the listing fails at once): each entry comes once. A provider that can start a listing after
a key (``resumes_listing``: S3's ``StartAfter``) is asked for the entries after
the one given last, so a long listing throttled now and then goes on where it
stopped (asked from its start, no retry got past the pages given before); the
entries up to it that come anyway are skipped by their order (a deeper prefix S3
gives again, a server that ignores ``StartAfter``), so an entry added or deleted
before it meanwhile changes nothing given. Another provider is listed
from the start and the entries already given are skipped. Providers list in a
stable order (S3 and Redis by key, local folders sorted); the skipped entries are
checked to end with the one given last, and a listing that changed meanwhile ends
with the error that stopped it rather than give an entry twice or miss one.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Callable

from ..config import RetryConfig, Timeouts
from ..errors import ServiceUnavailableError, TensorstreamError
from ..providers.base import ObjectInfo
from .timeout import operation, operation_deadline, past_total

__all__ = ["retried_listing"]


def _wait(exc: TensorstreamError, failed: int, policy: RetryConfig) -> float:
    """The server's ``Retry-After``, else a jittered exponential backoff."""
    after = getattr(exc, "retry_after", None)
    if isinstance(exc, ServiceUnavailableError) and isinstance(after, int | float) \
            and math.isfinite(after):
        return float(min(max(after, 0.0), policy.backoff_max))
    return random.uniform(0, min(policy.backoff_max, policy.backoff_initial * 2 ** (failed - 1)))


async def retried_listing(
        start: Callable[[str | None], AsyncIterator[ObjectInfo]], policy: RetryConfig,
        timeouts: Timeouts, *, final: Callable[[TensorstreamError, int], TensorstreamError],
        on_retry: Callable[[TensorstreamError], None] = lambda exc: None,
        resumes: bool | Callable[[], bool] = False,
) -> AsyncIterator[ObjectInfo]:
    """The entries of ``start(None)``, listed again after a temporary error; each
    step of the listing (to its next entry: a page's request, its retries and their
    waits) under ``timeouts.total``.

    ``resumes``: ``start(path)`` lists the entries after ``path`` (else only
    ``start(None)`` is called); a callable is asked before each try.
    ``final(exc, attempts)`` is the error raised once retrying stops (the retry
    layer's, naming the attempts); ``on_retry(exc)`` is told of each retry."""
    given = 0  # entries given to the caller
    last: str | None = None
    failed = 0  # attempts failed since the last new entry
    pending: TensorstreamError | None = None  # the error that made this a listing again
    step_at = operation_deadline(timeouts)  # this step's deadline: each retry's, each wait's
    while True:
        # (None: from the start, skipping `given`; a callable is asked at each try: a
        # listing found out of order cannot resume by key)
        after = last if (resumes() if callable(resumes) else resumes) else None
        skip = 0 if after is not None else given
        try:
            listing = start(after)
            try:
                while True:
                    # (the deadline is set for this step only: never across a yield,
                    # where it would reach the caller's own calls)
                    with operation(timeouts, step_at):
                        try:
                            info = await anext(listing)
                        except StopAsyncIteration:
                            break
                    if after is not None and info.path <= after:
                        # Given before: a deeper prefix given last (S3 gives it again),
                        # or a server that lists from the start whatever was asked.
                        continue
                    if skip:
                        skip -= 1
                        if skip == 0 and info.path != last:
                            skip = -1  # the listing changed
                            break
                        continue
                    yield info
                    given, last, failed = given + 1, info.path, 0
                    step_at = operation_deadline(timeouts)  # (the caller's time is not ours)
            finally:  # (a provider's generator left midway: its requests end now)
                close = getattr(listing, "aclose", None)
                if close is not None:
                    await close()
        except TensorstreamError as exc:
            if not exc.temporary:
                raise
            failed += 1
            if failed >= policy.attempts:
                _raise(final(exc, failed), exc)
            wait = _wait(exc, failed, policy)
            if step_at is not None and time.monotonic() + wait >= step_at:
                _raise(final(past_total(exc, wait, timeouts.total, "listing again"), failed),
                       exc)
            pending = exc
            on_retry(exc)
            await asyncio.sleep(wait)
            continue
        if skip and pending is not None:
            # Fewer entries, or others, than were given before: listing on could
            # give an entry twice or miss one.
            pending.message += ("; asked again, the listing had changed (the entries given "
                                "before are not its first ones now): list again")
            _raise(final(pending, failed), pending)
        return


def _raise(err: TensorstreamError, cause: TensorstreamError) -> None:
    if err is cause:
        raise err
    raise err from cause
