"""Whole remote tensorizer loads onto the CPU: fetcher threads read the file, tensorizer's
reader thread parses it from memory (tensorstream.tensorizer.remote). Bytes exact for
every mix of tensor sizes and fetcher counts, over HTTP, S3 and Redis; the parsing thread
never reads the stream; a failure mid-load hands out nothing and leaves no thread behind;
what is not a plain whole load keeps the in-place path."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import EncryptionParams

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensor_files import tensorizer_bytes
from tensorstream import errors
from tensorstream.tensorizer import inplace, remote
from tensorstream.tensorizer.hook import StreamTensorDeserializer
from tensorstream.tensorizer.load import Encryption
from tensorstream.tensorizer.remote import RemoteTensorDeserializer
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20
OPTIONS: dict[str, Any] = dict(part_size=256 << 10, readahead=2 * MiB, concurrency=8)


pytestmark = pytest.mark.usefixtures("http_reset")  # well-behaved servers, empty logs


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors of every kind of size: runs of tiny ones longer than a block's tail
    (stretches between blocks), ones just under and over the in-place minimum, large
    ones, 0-dim and empty ones, several dtypes."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for i in range(120):  # 120 tiny tensors in a row: more than one tail holds
        out[f"tiny{i}"] = torch.randint(0, 256, (1 + (i * 37) % 900,), dtype=torch.uint8,
                                        generator=gen)
    out["big"] = torch.randn(700, 1001, generator=gen)
    for n in ((64 << 10) - 1, 64 << 10, (64 << 10) + 1, 3 * MiB + 5, 17):
        out[f"u{n}"] = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    out["bf16"] = torch.randn(333, 77, generator=gen).to(torch.bfloat16)
    out["scalar"] = torch.tensor(3.5, dtype=torch.float64)
    out["empty"] = torch.empty(0, 5)
    for i in range(40):
        out[f"mid{i}"] = torch.randn(20 + i, 1024, generator=gen).to(torch.float16)
    return out


def _serve(server: HTTPTestServer, data: bytes, *, rate: int | None = None) -> str:
    key = f"remote-{os.urandom(4).hex()}.tensors"
    server.put(key, data)
    if rate is not None:
        server.faults.key, server.faults.rate_limit = key, rate
    return server.url(key)


def _same(d: Any, state: dict[str, torch.Tensor]) -> None:
    assert sorted(d) == sorted(state)
    for name, want in state.items():
        got = d[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name


def _fetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith("tensorstream-fetch-share-")]


@pytest.mark.parametrize("readers", [1, 2, 3, 7])
@pytest.mark.parametrize("rate", [None, 8 * MiB])
def test_bytes_exact_for_every_fetcher_count(http_server: HTTPTestServer, tmp_path: Path,
                                             readers: int, rate: int | None) -> None:
    state = _state()
    url = _serve(http_server, tensorizer_bytes(state, tmp_path), rate=rate)
    with tensorstream.deserialize(url, device="cpu", num_readers=readers, **OPTIONS) as d:
        assert isinstance(d, RemoteTensorDeserializer) and d._num_readers == 1
        _same(d, state)
        # each tensor owns its own bytes only (a block's tail is no part of it)
        for name, want in state.items():
            assert d[name].untyped_storage().nbytes() == want.numel() * want.element_size()
    assert not _fetch_threads()


@pytest.mark.parametrize("name", ["s3", "redis"])
def test_bytes_exact_over_s3_and_redis(name: str, request: pytest.FixtureRequest,
                                       tmp_path: Path) -> None:
    state = _state(1)
    data = tensorizer_bytes(state, tmp_path)
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        s3.put(S3_BUCKET, "remote/m.tensors", data)
        uri, options = f"s3://{S3_BUCKET}/remote/m.tensors", s3.options()
    else:
        server = request.getfixturevalue("redis_server")
        server.put("remote/m.tensors", data)
        uri, options = server.url("remote/m.tensors"), {}
    with tensorstream.deserialize(uri, device="cpu", num_readers=2, **options) as d:
        assert isinstance(d, RemoteTensorDeserializer)
        _same(d, state)


def test_the_parsing_thread_never_reads_the_stream(http_server: HTTPTestServer,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(2)
    url = _serve(http_server, tensorizer_bytes(state, tmp_path))
    readers: set[str] = set()
    real = tensorstream.StreamReader.readinto

    def spy(self: Any, b: Any) -> int:
        readers.add(threading.current_thread().name)
        return real(self, b)

    monkeypatch.setattr(tensorstream.StreamReader, "readinto", spy)
    with tensorstream.deserialize(url, device="cpu", num_readers=2, **OPTIONS) as d:
        _same(d, state)
    # the index is read by the opening thread; every tensor byte by the fetchers
    assert {n for n in readers if "fetch-share" not in n} <= {threading.current_thread().name}
    assert any("fetch-share" in n for n in readers)


def test_stretches_wait_for_the_parser_when_too_many_are_held(
        http_server: HTTPTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stretches between blocks are held as bytes until tensorizer reads them: a
    # fetcher far ahead of the parser waits instead of holding the whole file.
    monkeypatch.setattr(remote, "_MAX_HELD", 1000)
    held: list[int] = []
    real = remote.RemoteRun.received

    def spy(self: Any, pos: int, view: memoryview) -> bool:
        held.append(max(self._held))
        return bool(real(self, pos, view))

    monkeypatch.setattr(remote.RemoteRun, "received", spy)
    state = _state(3)
    url = _serve(http_server, tensorizer_bytes(state, tmp_path))
    with tensorstream.deserialize(url, device="cpu", num_readers=1, **OPTIONS) as d:
        _same(d, state)
    # at most one stretch over the limit (the one read after the parser caught up)
    assert max(held) <= 1000 + max(t.numel() * t.element_size() for t in state.values()) + (
        64 << 10)


def test_a_later_share_holding_its_limit_never_stops_the_earlier_one(
        http_server: HTTPTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tensorizer reads the shares in order: the second fetcher, far ahead, holds its
    # limit of stretches and waits; the first must go on (one bound for both deadlocked).
    monkeypatch.setattr(remote, "_MAX_HELD", 1000)
    monkeypatch.setattr(remote, "STRETCH", 4000)
    gen = torch.Generator().manual_seed(7)
    state = {f"tiny{i}": torch.randint(0, 256, (500,), dtype=torch.uint8, generator=gen)
             for i in range(400)}  # stretches only: no tensor has a block
    url = _serve(http_server, tensorizer_bytes(state, tmp_path), rate=2 * MiB)
    with tensorstream.deserialize(url, device="cpu", num_readers=2, **OPTIONS) as d:
        _same(d, state)
    assert not _fetch_threads()


@pytest.mark.parametrize("readers", [1, 3])
def test_a_failure_mid_load_hands_out_nothing_and_stops_every_fetcher(
        http_server: HTTPTestServer, tmp_path: Path, readers: int) -> None:
    state = _state(4)
    url = _serve(http_server, tensorizer_bytes(state, tmp_path), rate=8 * MiB)
    # The object changes after a few requests: every later ranged GET is refused
    # (pinned to the version opened), in the middle of the fetch.
    http_server.faults.replace_after_requests = 4
    with pytest.raises(errors.TensorstreamError):
        tensorstream.deserialize(url, device="cpu", num_readers=readers, **OPTIONS)
    assert not _fetch_threads()


def test_hashes_are_checked_on_bytes_served_from_memory(http_server: HTTPTestServer,
                                                        tmp_path: Path) -> None:
    state = _state(5)
    data = bytearray(tensorizer_bytes(state, tmp_path))
    t = state["tiny50"].numpy().tobytes()  # a tiny tensor: in a stretch or a tail
    at = bytes(data).index(t)
    data[at] ^= 0xFF
    url = _serve(http_server, bytes(data))
    with pytest.raises(errors.TensorstreamError, match="verify_hash"):
        tensorstream.deserialize(url, device="cpu", verify_hash=True, **OPTIONS)


def test_only_whole_plain_loads_onto_the_cpu_are_fetched(http_server: HTTPTestServer,
                                                         tmp_path: Path) -> None:
    state = _state(6)
    url = _serve(http_server, tensorizer_bytes(state, tmp_path))
    with tensorstream.deserialize(url, device="cpu", lazy_load=True, **OPTIONS) as d:
        assert type(d) is StreamTensorDeserializer
        assert torch.equal(d["big"], state["big"])
    with tensorstream.deserialize(url, device="cpu", filter_func=lambda n: n.startswith("mid"),
                                  **OPTIONS) as d:
        assert type(d) is StreamTensorDeserializer
        assert sorted(d) == sorted(n for n in state if n.startswith("mid"))
    params = EncryptionParams.random()
    del state["empty"]  # (tensorizer cannot write an encrypted empty tensor)
    secret = _serve(http_server, tensorizer_bytes(state, tmp_path, params))
    with tensorstream.deserialize(secret, device="cpu", encryption=Encryption(key=params.key),
                                  **OPTIONS) as d:
        assert type(d) is StreamTensorDeserializer
        _same(d, state)


def test_pieces_cover_the_file_back_to_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setattr(remote, "STRETCH", 10_000)
    pos, entries = 1000, []
    for n in [10, 70 << 10, 5, 5, 300 << 10, *([100] * 900), 64 << 10, 1]:
        entries.append(types.SimpleNamespace(offset=pos, data_offset=pos + 90, data_length=n,
                                             deserialized_length=n))
        pos += 90 + n
    assert remote.applies(entries)
    got = remote.pieces(entries)
    assert got[0].start == 1000 and got[-1].end == pos
    assert all(a.end == b.start for a, b in itertools.pairwise(got))
    # every tensor of at least 64 KiB starts a block (its own memory); the rest are stretches
    # of at most STRETCH bytes each
    blocks = {p.start for p in got if p.memory is not None}
    assert all(p.end - p.start <= remote.STRETCH for p in got if p.memory is None)
    # the tiny run (less what a tail holds) was cut
    assert sum(p.memory is None for p in got) >= (900 * 190 - inplace.MAX_TAIL) // 10_000
    assert {e.data_offset for e in entries if e.data_length >= 64 << 10} <= blocks
    entries[3].offset += 1  # a gap: not back to back
    assert not remote.applies(entries)


@pytest.mark.parametrize("sizes, parts", [([5, 5, 5, 5], 2), ([100, 1, 1, 1], 3), ([1], 4),
                                          ([1] * 50, 7), ([0, 0, 9], 2), ([7, 1 << 30, 7], 5)])
def test_shares_are_contiguous_non_empty_and_at_most_the_count(sizes: list[int],
                                                               parts: int) -> None:
    got = remote.shares(sizes, parts)
    assert 1 <= len(got) <= parts and all(got)
    assert [i for r in got for i in r] == list(range(len(sizes)))
    assert remote.shares([5, 5, 5, 5], 2) == [range(0, 2), range(2, 4)]
