"""A writer's request sent again after a temporary error (a 5xx, a throttle, a
dropped connection), under the retry policy: ``retries`` attempts in all, the backoff
``backoff_initial``/``backoff_max``, a ``Retry-After`` honoured -- the loop of
:mod:`.retrying`, which reads, listings and deletes run in. One loop for every
backend's writer: S3's parts, ``PutObject`` and ``CompleteMultipartUpload``
(:mod:`tensorstream.providers.s3.publish` first looks whether the attempt before was
applied) and Redis's chunks, ``PERSIST`` and publish
(:mod:`tensorstream.providers.redis.publish`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..config import RetryConfig
from ..errors import TensorstreamError

__all__ = ["sent_again"]

log = logging.getLogger("tensorstream.retry")

T = TypeVar("T")


async def sent_again(policy: RetryConfig, first: TensorstreamError,
                     send: Callable[[], Awaitable[T]], *, still_open: Callable[[], bool],
                     what: str) -> T:
    """``send()`` again until it succeeds, ``first`` (the temporary error of its first
    attempt, made outside any loop: nearly every request succeeds at once) counting as
    the loop's first attempt and waited on as its own. Only temporary errors are
    retried, and only while ``still_open()``, also looked at after each wait (an
    aborted write sends nothing more: a request sent then could land after the
    abort); the last error is raised."""
    from .retrying import retrying  # (only a request that failed gets here)

    def again(state: Any) -> None:
        log.debug("%s: %s; sent again", what,
                  state.outcome.exception() if state.outcome else None)

    pending: TensorstreamError | None = first
    last = first
    async for attempt in retrying(
            policy, None,
            retry_if=lambda e: isinstance(e, TensorstreamError) and e.temporary and still_open(),
            before_sleep=again):
        with attempt:
            if pending is not None:  # the first attempt's error, waited on as its own
                failed, pending = pending, None
                raise failed
            if not still_open():  # aborted during the wait: the abort cleans up next
                raise last
            try:
                return await send()
            except TensorstreamError as exc:
                last = exc
                raise
    raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover
