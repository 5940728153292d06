"""The waits between a read's attempts count in ``timeout_total``: a wait that would
end past the deadline is not waited (the read fails at once, saying so), as a
listing's (``tests/layers/test_listing_retries.py``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.backends import Backend

pytestmark = pytest.mark.usefixtures("isolated_env")


def _read(uri: str, **options: Any) -> bytes:
    return asyncio.run(tensorstream.read_range(uri, 0, 3, **options))


def _stored(store: Backend) -> str:
    key = f"waits-{uuid.uuid4().hex[:8]}"
    store.put(key, b"abcdef")
    return key


@pytest.mark.parametrize("backend", ["tensorstream_http", "tensorstream_s3"])
def test_a_read_does_not_wait_past_timeout_total(request: pytest.FixtureRequest,
                                                 backend: str) -> None:
    # It waited the server's Retry-After (3 s) and then failed at once on the deadline.
    store: Backend = request.getfixturevalue(backend)
    key = _stored(store)
    store.faults.status_script([503] * 5, retry_after=3.0)
    started = time.monotonic()
    with pytest.raises(errors.TensorstreamError) as info:
        _read(store.uri(key), **store.options, timeout_total=1.0)
    assert time.monotonic() - started < 1.0
    assert "in 3 s would pass the total deadline" in str(info.value), str(info.value)
    assert "--timeout-total 2" in str(info.value), str(info.value)


def test_a_read_whose_waits_fit_is_read(tensorstream_http: Backend) -> None:
    key = _stored(tensorstream_http)
    tensorstream_http.faults.status_script([503, 503], retry_after=0.2)
    assert _read(tensorstream_http.uri(key), **tensorstream_http.options,
                 timeout_total=2.0) == b"abc"
