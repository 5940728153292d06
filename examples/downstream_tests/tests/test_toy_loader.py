"""Tests of toy_loader against every mocked backend, with one test per fault kind.

Only tensorstream's public fixtures and API are used.
"""

from __future__ import annotations

import time

import pytest
import torch
from toy_loader import load_state_dict, to_tensorizer_bytes

from tensorstream.errors import ObjectChangedError, ProtocolError

KEY = "models/toy.tensors"


def make_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 256, generator=g),
        "proj.weight": torch.randn(256, 512, generator=g).to(torch.float16),
        "proj.bias": torch.randn(512, generator=g),
    }


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype
        assert torch.equal(got[name], tensor), name


@pytest.fixture
def stored(tensorstream_backend):
    """The toy model stored on the backend under test; yields (backend, state)."""
    state = make_state()
    tensorstream_backend.put(KEY, to_tensorizer_bytes(state))
    return tensorstream_backend, state


def load(backend, **extra):
    return load_state_dict(backend.uri(KEY), **backend.options, **extra)


def test_loads_exactly(stored):
    backend, state = stored
    assert_same(load(backend), state)


def test_latency_still_loads(stored):
    backend, state = stored
    backend.faults.latency(0.1)
    t0 = time.monotonic()
    assert_same(load(backend), state)
    assert time.monotonic() - t0 >= 0.1


def test_rate_cap_is_slower_but_exact(stored):
    backend, state = stored
    size = len(backend.get(KEY))
    backend.faults.rate_limit(size)  # each connection: at most the whole file per second
    t0 = time.monotonic()
    assert_same(load(backend), state)
    assert time.monotonic() - t0 >= 0.3


def test_dropped_connection_is_resumed_exactly(stored):
    backend, state = stored
    backend.faults.drop_after(100_000, times=1)
    assert_same(load(backend), state)
    assert backend.faults.dropped == 1


def test_503s_are_retried(stored):
    backend, state = stored  # Redis has no HTTP statuses: skipped there
    backend.faults.status_script([503, 503, 200])
    assert_same(load(backend, backoff_initial=0.01), state)
    assert backend.faults.pending_statuses == []


def test_ignored_range_is_a_clear_error(stored):
    backend, _ = stored  # Redis has no Range header: skipped there
    backend.faults.ignore_range()
    with pytest.raises(ProtocolError, match=r"(?i)range"):
        load(backend)


def test_replaced_between_reads_is_detected(stored):
    backend, _ = stored
    backend.faults.replace_between_reads(KEY, to_tensorizer_bytes(make_state(seed=1)))
    # Without read-ahead or streamed reads every read is a new request, so the
    # replacement is seen (otherwise the old version may already be on its way:
    # also never a mix).
    with pytest.raises(ObjectChangedError):
        load(backend, readahead=0, part_size=64 << 10, stream_reads=False)
    assert_same(load(backend), make_state(seed=1))  # a new load sees the new version


@pytest.mark.tensorstream_http(tls=True, token=True)
def test_https_with_token(tensorstream_http):
    state = make_state()
    tensorstream_http.put(KEY, to_tensorizer_bytes(state))
    assert tensorstream_http.ca_bundle is not None
    assert_same(load(tensorstream_http), state)


def test_redis_kind(tensorstream_redis):
    assert tensorstream_redis.kind in ("redis-server", "fakeredis")
