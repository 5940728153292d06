"""The retry loop of :class:`~tensorstream.layers.stack.PolicyProvider`: tenacity's,
with the attempt budget and the waits that the policy layer defines (the S3
writer's abort of an upload runs in it too, with a short budget of its own).

Imported only when a call failed once: nearly every call succeeds at its first
attempt, which runs outside any loop, so a process whose requests all succeed
never imports tenacity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import tenacity

from ..config import RetryConfig
from ..errors import ServiceUnavailableError, TensorstreamError
from .timeout import past_total

__all__ = ["ADAPTING_COST", "retrying"]

#: What a throttle costs of the attempts while the service answers other
#: requests (``ServiceUnavailableError.adapting``): the data plane is narrowing
#: to what the service takes (``providers/_http/throttle.py``), so a request may
#: be throttled several times before the width settles.
ADAPTING_COST = 0.1


def _adapting(exc: BaseException | None) -> bool:
    return isinstance(exc, ServiceUnavailableError) and exc.adapting


class _AttemptBudget(tenacity.stop.stop_base):
    """Tenacity stop (one per call): ``attempts`` failures, an adapting throttle
    counting :data:`ADAPTING_COST` of one."""

    def __init__(self, attempts: int) -> None:
        self._attempts = attempts
        self._spent = 0.0

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        self._spent += ADAPTING_COST if _adapting(exc) else 1.0
        return self._spent >= self._attempts - 1e-9


class _RetryAfterWait(tenacity.wait.wait_base):
    """Tenacity wait: the server's Retry-After if given; for an adapting throttle
    a jitter of at most a quarter of ``initial`` (the gate holds the retry until
    the narrower width has room); else jittered exponential."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._fallback = tenacity.wait_random_exponential(multiplier=initial, max=maximum)
        self._adapting = tenacity.wait_random(0, min(maximum, initial / 4))
        self._max = maximum

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        # Only a finite number is a wait (a provider's NaN would reach time.sleep).
        if (isinstance(exc, ServiceUnavailableError) and isinstance(retry_after, int | float)
                and math.isfinite(retry_after)):
            return float(min(max(retry_after, 0.0), self._max))
        if _adapting(exc):
            return float(self._adapting(retry_state))
        return float(self._fallback(retry_state))


class _BeforeDeadline(tenacity.stop.stop_base):
    """Tenacity stop: the wait before the next attempt would end at or past ``at``
    (``time.monotonic()``); the last error then says so (:func:`.timeout.past_total`).
    (tenacity before 8.3 computes the wait after the stop: there only the attempts
    themselves are cut at the deadline.)"""

    def __init__(self, at: float, total: float | None) -> None:
        self._at, self._total = at, total

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        wait = float(getattr(retry_state, "upcoming_sleep", 0.0) or 0.0)
        if time.monotonic() + wait < self._at:
            return False
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, TensorstreamError):
            past_total(exc, wait, self._total)
        return True


def retrying(policy: RetryConfig, total: float | None, *,
             retry_if: Callable[[BaseException], bool],
             before_sleep: Callable[[tenacity.RetryCallState], None],
             blocking: bool = False, at: float | None = None) -> Any:
    """A tenacity retry loop for one call (``tenacity.Retrying`` when ``blocking``,
    else ``AsyncRetrying``): ``policy.attempts`` attempts at most, within
    ``total`` seconds when given and never waiting past ``at`` (the operation's
    deadline, ``time.monotonic()``), retrying the errors ``retry_if`` accepts and
    re-raising the last one."""
    stop: Any = _AttemptBudget(policy.attempts)
    if total is not None:
        stop = stop | tenacity.stop_after_delay(total)
    if at is not None:
        stop = stop | _BeforeDeadline(at, total)
    cls = tenacity.Retrying if blocking else tenacity.AsyncRetrying
    return cls(
        stop=stop,
        wait=_RetryAfterWait(policy.backoff_initial, policy.backoff_max),
        retry=tenacity.retry_if_exception(retry_if),
        reraise=True,
        before_sleep=before_sleep,
    )
