"""tensorstream.layers.retrying: the policy layer's retry loop (tenacity's)."""

from __future__ import annotations

import asyncio

import pytest
import tenacity

from tensorstream import errors
from tensorstream.config import RetryConfig
from tensorstream.layers.retrying import ADAPTING_COST, retrying


def _policy(attempts: int = 3) -> RetryConfig:
    return RetryConfig(attempts=attempts, backoff_initial=0.001, backoff_max=0.01)


def _temporary(exc: BaseException) -> bool:
    return bool(getattr(exc, "temporary", False))


def _throttle() -> errors.ServiceUnavailableError:
    exc = errors.ServiceUnavailableError("slow down", retry_after=0.0)
    exc.adapting = True
    return exc


def _run(failures: list[BaseException], *, attempts: int = 3) -> tuple[int, BaseException | None]:
    calls = 0
    loop = retrying(_policy(attempts), None, retry_if=_temporary, before_sleep=lambda s: None,
                    blocking=True)
    try:
        for attempt in loop:
            with attempt:
                calls += 1
                if failures:
                    raise failures.pop(0)
    except BaseException as exc:  # (the loop re-raises the last error)
        return calls, exc
    return calls, None


def test_temporary_errors_are_retried_until_the_attempts_are_spent() -> None:
    busy = [errors.ServiceUnavailableError("busy", retry_after=0.0) for _ in range(5)]
    calls, exc = _run(busy, attempts=3)
    assert calls == 3
    assert isinstance(exc, errors.ServiceUnavailableError)  # the last error, re-raised


def test_a_permanent_error_is_not_retried() -> None:
    calls, exc = _run([errors.NotFoundError("gone")], attempts=5)
    assert calls == 1 and isinstance(exc, errors.NotFoundError)


def test_an_adapting_throttle_costs_a_fraction_of_an_attempt() -> None:
    # Two attempts' budget: a real failure spends one; throttles while the data
    # plane narrows spend ADAPTING_COST each, so many of them fit.
    throttles = int(1 / ADAPTING_COST) - 1
    failures: list[BaseException] = [_throttle() for _ in range(throttles)]
    failures.append(errors.ServiceUnavailableError("busy", retry_after=0.0))
    calls, exc = _run(failures, attempts=2)
    assert (calls, exc) == (throttles + 2, None)


@pytest.mark.parametrize("retry_after, waited", [(0.5, 0.5), (30.0, 1.0), (-1.0, 0.0)])
def test_retry_after_is_honoured_within_the_backoff_cap(retry_after: float, waited: float) -> None:
    seen: list[float] = []
    policy = RetryConfig(attempts=3, backoff_initial=0.001, backoff_max=1.0)
    loop = retrying(policy, None, retry_if=_temporary, blocking=True,
                    before_sleep=lambda s: seen.append(s.next_action.sleep))  # type: ignore[union-attr]
    loop.sleep = lambda seconds: None  # (the wait is what is checked, not slept)
    busy = errors.ServiceUnavailableError("busy", retry_after=retry_after)
    with pytest.raises(errors.ServiceUnavailableError):
        for attempt in loop:
            with attempt:
                raise busy
    assert seen == [waited, waited]


def test_the_async_loop_is_tenacitys_async_retrying() -> None:
    loop = retrying(_policy(), 5.0, retry_if=_temporary, before_sleep=lambda s: None)
    assert isinstance(loop, tenacity.AsyncRetrying)
    calls = 0

    async def go() -> None:
        nonlocal calls
        async for attempt in loop:
            with attempt:
                calls += 1
                if calls < 2:
                    raise errors.ServiceUnavailableError("busy", retry_after=0.0)

    asyncio.run(go())
    assert calls == 2
