"""Closing an S3 provider from another event loop than the one its aiobotocore
client (writes, deletes, bucket listings) was made on: the sync API writes on
tensorstream's I/O loop, a program closes from its own ``asyncio.run``, or the
other way round. The client was dropped without being closed: aiohttp printed
"Unclosed client session" (a ``ResourceWarning``, an error on the asyncio
logger) and its pooled connections stayed open until garbage collection."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fixtures_s3 import S3_BUCKET, s3_provider
from tensorstream import _loop
from tensorstream.providers.s3.provider import S3Provider
from tensorstream.testing.s3_server import MotoS3Server


async def _write_and_delete(p: S3Provider) -> None:
    """Uses the aiobotocore client (its session and connection pool)."""
    path = f"{S3_BUCKET}/close/{uuid.uuid4().hex[:10]}"
    async with p.open_writer(path) as w:
        await w.write(b"some bytes")
    assert await p.read_range(path, 0, 10) == b"some bytes"
    await p.delete(path)


@pytest.fixture
def unclosed(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """What aiohttp said about sessions and connections left unclosed (collected now)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")

        def check() -> list[str]:
            gc.collect()
            return ([str(w.message) for w in said if issubclass(w.category, ResourceWarning)]
                    + [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()])
        yield check


@pytest.fixture
def other_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own (a program's, a server's)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(60)


def test_written_through_the_io_loop_closed_from_asyncio_run(
        moto_s3: MotoS3Server, unclosed: Callable[[], list[str]]) -> None:
    p = s3_provider(moto_s3)
    _loop.run_sync(_write_and_delete(p))  # as tensorstream.open(uri, "wb") does
    asyncio.run(p.close())
    assert unclosed() == []
    _loop.run_sync(_write_and_delete(p))  # usable again after close
    _loop.run_sync(p.close())
    assert unclosed() == []


def test_written_in_a_finished_asyncio_run_closed_through_the_io_loop(
        moto_s3: MotoS3Server, unclosed: Callable[[], list[str]]) -> None:
    p = s3_provider(moto_s3)
    asyncio.run(_write_and_delete(p))  # that loop is closed now
    _loop.run_sync(p.close())
    assert unclosed() == []


def test_written_on_a_loop_in_another_thread_closed_from_here(
        moto_s3: MotoS3Server, other_loop: asyncio.AbstractEventLoop,
        unclosed: Callable[[], list[str]]) -> None:
    p = s3_provider(moto_s3)
    _on(other_loop, _write_and_delete(p))
    asyncio.run(p.close())  # closed on the loop that runs the client, waited for
    assert unclosed() == []
    _on(other_loop, _write_and_delete(p))
    _on(other_loop, p.close())  # the same loop: as before
    assert unclosed() == []


def test_used_on_a_new_loop_after_its_loop_finished(
        moto_s3: MotoS3Server, unclosed: Callable[[], list[str]]) -> None:
    # the client of a finished asyncio.run was replaced without being closed
    p = s3_provider(moto_s3)
    asyncio.run(_write_and_delete(p))
    asyncio.run(_write_and_delete(p))
    _loop.run_sync(_write_and_delete(p))
    _loop.run_sync(p.close())
    assert unclosed() == []


def test_used_from_two_running_loops_in_turn(
        moto_s3: MotoS3Server, other_loop: asyncio.AbstractEventLoop,
        unclosed: Callable[[], list[str]]) -> None:
    # Each turn replaced the other loop's client, dropped unclosed (it may still have
    # had requests in flight there) and made again on the next turn.
    p = s3_provider(moto_s3)
    for _ in range(2):
        _on(other_loop, _write_and_delete(p))
        _loop.run_sync(_write_and_delete(p))
    assert unclosed() == []
    asyncio.run(p.close())  # both closed, each on its own loop
    assert unclosed() == []
