"""The copy's task helpers: nothing a step started is still running once it returns or raises."""

from __future__ import annotations

import asyncio

import pytest

from tensorstream.copy.tasks import cancel_and_wait, gather_or_cancel


async def test_the_first_failure_stops_the_others_before_it_is_raised() -> None:
    ended: list[str] = []

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("boom")

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # still cleaning up when cancelled
            ended.append("waiter")

    with pytest.raises(ValueError, match="boom"):
        await gather_or_cancel([fails(), waits_forever()])
    assert ended == ["waiter"]


async def test_cancel_and_wait_ends_every_task_and_drops_their_outcomes() -> None:
    async def fails() -> None:
        raise ValueError("dropped")

    tasks = [asyncio.ensure_future(fails()), asyncio.ensure_future(asyncio.sleep(10))]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)
    assert all(t.done() for t in tasks)
    await cancel_and_wait([])  # nothing to do
