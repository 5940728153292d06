"""tensorizer loads on the CPU receive read-ahead straight into the tensors' own memory
(tensorstream.tensorizer.inplace): bytes exact across segment boundaries and readers,
with encryption, hashes, filter_func and lazy loads, no read-ahead buffers held for
tensor data, each tensor owning only its own bytes, and a failure mid-load never
handing out a tensor."""

from __future__ import annotations

import itertools
import os
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import EncryptionParams, TensorSerializer

import tensorstream
from tensorstream import errors
from tensorstream.tensorizer import inplace
from tensorstream.tensorizer.hook import forks
from tensorstream.tensorizer.load import Encryption
from tensorstream.testing.http_server import HTTPTestServer

MiB = 1 << 20
#: Small parts so that tensors straddle many of them, and tensors of sizes that are
#: no multiple of anything: each shape is (n,) uint8 plus a few other dtypes.
OPTIONS: dict[str, Any] = dict(part_size=256 << 10, readahead=2 * MiB, concurrency=8)
SIZES = [3 * MiB + 5, 100, 300 << 10, 4099, MiB + 7, 2 * MiB, 70 << 10, 700 << 10, 12,
         (256 << 10) - 1, 256 << 10, 5 * MiB + 3]


pytestmark = pytest.mark.usefixtures("http_reset")  # well-behaved servers, empty logs


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {f"t{i}": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
           for i, n in enumerate(SIZES)}
    out["f32"] = torch.randn(300, 513, generator=gen)
    out["bf16"] = torch.randn(700, 333, generator=gen).to(torch.bfloat16)
    out["i64"] = torch.arange(50_001, dtype=torch.int64)
    return out


def _bytes(state: dict[str, torch.Tensor], folder: Path, encryption: Any = None) -> bytes:
    path = folder / f"m-{os.urandom(4).hex()}.tensors"
    ser = TensorSerializer(str(path), encryption=encryption)
    ser.write_state_dict(state)
    ser.close()
    return path.read_bytes()


def _serve(server: HTTPTestServer, data: bytes, *, rate: int | None = 8 * MiB) -> str:
    key = f"inplace-{os.urandom(4).hex()}.tensors"
    server.put(key, data)
    server.faults.key, server.faults.rate_limit = key, rate
    return server.url(key)


def _reader_stats(d: Any) -> list[dict[str, Any]]:
    return [r.read_stats() for r in [d._source, *forks(d)]]


def _big_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@pytest.mark.parametrize("readers", [1, 2, 3])
def test_bytes_exact_and_received_in_place(http_server: HTTPTestServer, tmp_path: Path,
                                           readers: int) -> None:
    state = _state()
    url = _serve(http_server, _bytes(state, tmp_path))
    with tensorstream.deserialize(url, device="cpu", num_readers=readers, **OPTIONS) as d:
        assert sorted(d) == sorted(state)
        for name, want in state.items():
            got = d[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got, want), name
            # each tensor owns its own bytes only (a tail allocated with it is no part of it)
            assert got.untyped_storage().nbytes() == want.numel() * want.element_size(), name
        stats = _reader_stats(d)
    direct = sum(s["direct_bytes"] for s in stats)
    copied = sum(s["copied_bytes"] for s in stats)
    # Every tensor was received in place (small ones sharing requests): only headers
    # were copied.
    assert direct >= _big_bytes(state), stats
    assert copied < 64 << 10, stats
    assert all(s["readahead_peak"] <= 4 * OPTIONS["part_size"] for s in stats), stats


def test_safetensors_can_save_what_was_loaded(http_server: HTTPTestServer,
                                              tmp_path: Path) -> None:
    # Tensors must not share memory (safetensors refuses that): each has its own allocation.
    from safetensors.torch import load_file, save_file

    state = _state(1)
    url = _serve(http_server, _bytes(state, tmp_path), rate=None)
    with tensorstream.deserialize(url, device="cpu", **OPTIONS) as d:
        loaded = dict(d.items())
    save_file(loaded, str(tmp_path / "out.safetensors"))
    again = load_file(str(tmp_path / "out.safetensors"))
    assert all(torch.equal(again[k], v) for k, v in state.items())


@pytest.mark.parametrize("verify_hash", [False, True])
def test_encrypted_tensors_are_decrypted_in_place(http_server: HTTPTestServer, tmp_path: Path,
                                                  verify_hash: bool) -> None:
    state = _state(2)
    params = EncryptionParams.random()
    url = _serve(http_server, _bytes(state, tmp_path, params))
    with tensorstream.deserialize(url, device="cpu", num_readers=2, verify_hash=verify_hash,
                                  encryption=Encryption(key=params.key), **OPTIONS) as d:
        for name, want in state.items():
            assert torch.equal(d[name], want), name
        stats = _reader_stats(d)
    assert sum(s["direct_bytes"] for s in stats) >= _big_bytes(state), stats


def test_hashes_are_checked_on_what_was_received_in_place(http_server: HTTPTestServer,
                                                          tmp_path: Path) -> None:
    state = _state(3)
    data = bytearray(_bytes(state, tmp_path))
    # flip one byte in the middle of the largest tensor's data (the last tensor)
    t = state["t11"].numpy().tobytes()
    at = bytes(data).index(t[: 1 << 10]) + len(t) // 2
    data[at] ^= 0xFF
    url = _serve(http_server, bytes(data))
    with pytest.raises(errors.TensorstreamError, match="verify_hash"):
        tensorstream.deserialize(url, device="cpu", verify_hash=True, **OPTIONS)


def test_filter_func_loads_only_the_wanted_tensors(http_server: HTTPTestServer,
                                                   tmp_path: Path) -> None:
    state = _state(4)
    wanted = {"t0", "t4", "t5", "f32", "t11"}  # gaps between them: skipped tensors
    url = _serve(http_server, _bytes(state, tmp_path))
    with tensorstream.deserialize(url, device="cpu", num_readers=2,
                                  filter_func=lambda name: name in wanted, **OPTIONS) as d:
        assert sorted(d) == sorted(wanted)
        for name in wanted:
            assert torch.equal(d[name], state[name]), name


def test_lazy_loads_with_skips(http_server: HTTPTestServer, tmp_path: Path) -> None:
    state = _state(5)
    url = _serve(http_server, _bytes(state, tmp_path))
    order = ["t0", "t4", "t5", "t11", "bf16"]  # forward (tensorizer's lazy loads), with gaps
    with tensorstream.deserialize(url, device="cpu", lazy_load=True, **OPTIONS) as d:
        for name in order:
            assert torch.equal(d[name], state[name]), name


def test_a_failure_mid_load_hands_out_no_tensor(http_server: HTTPTestServer,
                                                tmp_path: Path) -> None:
    state = _state(6)
    url = _serve(http_server, _bytes(state, tmp_path))
    # The object changes after a few requests: every later ranged GET is refused
    # (412, pinned to the version opened), in the middle of the read-ahead.
    http_server.faults.replace_after_requests = 6
    got: dict[str, torch.Tensor] = {}
    with pytest.raises(errors.TensorstreamError):
        with tensorstream.deserialize(url, device="cpu", lazy_load=True, **OPTIONS) as d:
            for name in d:
                got[name] = d[name]
    assert len(got) < len(state)  # it did fail mid-load ...
    for name, tensor in got.items():  # ... and what it handed out before is whole
        assert torch.equal(tensor, state[name]), name
    # An eager load raises (its tensors were never handed out).
    http_server.faults.reset()
    url = _serve(http_server, _bytes(state, tmp_path))
    http_server.faults.replace_after_requests = 6
    with pytest.raises(errors.TensorstreamError):
        tensorstream.deserialize(url, device="cpu", num_readers=2, **OPTIONS)


def test_device_other_than_cpu_and_local_files_are_not_in_place(tmp_path: Path) -> None:
    state = _state(7)
    path = tmp_path / "m.tensors"
    path.write_bytes(_bytes(state, tmp_path))
    with tensorstream.deserialize(str(path), device="cpu") as d:  # a plain OS file
        assert not getattr(d, "_ts_inplace", False)
        assert all(torch.equal(d[k], v) for k, v in state.items())


def test_read_ahead_holds_no_buffers_for_tensor_data_on_a_paced_link(
        http_server: HTTPTestServer, tmp_path: Path) -> None:
    """The memory bound: with 32 connections in flight, read-ahead buffers hold at
    most headers and small tensors, never the tensors' data (it was the whole
    ``readahead`` budget, on top of the tensors, before)."""
    gen = torch.Generator().manual_seed(8)
    state = {f"w{i}": torch.randn(256 + i, 1024, generator=gen) for i in range(48)}  # ~1 MiB
    url = _serve(http_server, _bytes(state, tmp_path), rate=2 * MiB)
    options = dict(part_size=512 << 10, readahead=16 * MiB, concurrency=32)
    with tensorstream.deserialize(url, device="cpu", num_readers=2, **options) as d:
        assert all(torch.equal(d[k], v) for k, v in state.items())
        stats = _reader_stats(d)
    assert max(s["peak_in_flight"] for s in stats) >= 8, stats
    assert max(s["readahead_peak"] for s in stats) <= 4 * options["part_size"], stats
    assert sum(s["copied_bytes"] for s in stats) < 256 << 10, stats
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert http_server.bytes_sent(url.rsplit("/", 1)[1]) < total * 1.05  # nothing fetched twice


def test_small_tensors_share_requests_and_land_in_place(http_server: HTTPTestServer,
                                                        tmp_path: Path) -> None:
    # 64 tensors of 100-160 KiB, 512 KiB requests: several tensors (and the headers
    # between them) per request, each received into its own tensor.
    gen = torch.Generator().manual_seed(9)
    state = {f"s{i}": torch.randn(25 + i % 16, 1024, generator=gen) for i in range(64)}
    url = _serve(http_server, _bytes(state, tmp_path), rate=4 * MiB)
    key = url.rsplit("/", 1)[1]
    options = dict(part_size=512 << 10, readahead=4 * MiB, concurrency=16)
    with tensorstream.deserialize(url, device="cpu", num_readers=2, **options) as d:
        assert all(torch.equal(d[k], v) for k, v in state.items())
        stats = _reader_stats(d)
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert len(http_server.requests_for(key, "GET")) < 64 / 2, stats  # not one per tensor
    # Headers only, and at most one part per change of mode: a reader that leaves
    # its stream inside a read receives the part holding the stream's end into a
    # buffer when that part reaches past the read.
    switches = sum(s["changes"] for s in stats)
    assert sum(s["copied_bytes"] for s in stats) < (64 << 10) + switches * options["part_size"], stats
    assert sum(s["direct_bytes"] for s in stats) >= total, stats
    assert max(s["readahead_peak"] for s in stats) <= 4 * options["part_size"], stats


# -- the plan ---------------------------------------------------------------------------


def _entry(offset: int, header: int, length: int, deserialized: int | None = None) -> Any:
    return types.SimpleNamespace(offset=offset, data_offset=offset + header, data_length=length,
                                 deserialized_length=length if deserialized is None
                                 else deserialized)


def _file(*lengths: int, header: int = 100) -> list[Any]:
    out, pos = [], 1000
    for n in lengths:
        out.append(_entry(pos, header, n))
        pos += header + n
    return out


def test_plan_one_block_per_tensor_with_the_next_header() -> None:
    big = 256 << 10
    e = _file(big, 2 * big, big)
    header, *blocks = inplace.plan(e)
    # the first header: a block of its own (a request starting there lands in place too)
    assert (header.start, header.end, header.nbytes) == (e[0].offset, e[0].data_offset, 0)
    assert [(b.start, b.end, b.header, b.nbytes) for b in blocks] == [
        (e[0].data_offset, e[1].data_offset, e[0].offset, big),  # its data and e1's header
        (e[1].data_offset, e[2].data_offset, e[1].offset, 2 * big),
        (e[2].data_offset, e[2].data_offset + big, e[2].offset, big),  # the last: data only
    ]


def test_plan_small_tensors_ride_in_the_tail_up_to_max_tail() -> None:
    big, small = 256 << 10, 1000
    e = _file(big, small, small, big, *([small] * 80), big)
    blocks = [b for b in inplace.plan(e, min_size=big) if b.nbytes]
    assert [b.header for b in blocks] == [e[0].offset, e[3].offset, e[-1].offset]
    assert blocks[0].end == e[3].data_offset  # two small tensors and two headers ride along
    # 80 small tensors are more than MAX_TAIL: the tail stops where it would pass it
    assert blocks[1].end - (blocks[1].start + big) <= inplace.MAX_TAIL
    assert blocks[1].end < e[-1].data_offset


def test_plan_gaps_meta_tensors_and_small_ones_end_a_block() -> None:
    big = 256 << 10
    e = _file(big, big, big)
    gap = [e[0], _entry(e[2].offset, 100, big)]  # a skipped tensor between (filter_func)
    blocks = inplace.plan(gap)
    assert [b.nbytes for b in blocks] == [0, big, 0, big]  # the header after the gap: its own
    assert blocks[1].end == e[0].data_offset + big  # not contiguous: no tail
    meta = [e[0], _entry(e[1].offset, 100, 0, big)]  # written without data
    assert [b.header for b in inplace.plan(meta) if b.nbytes] == [e[0].offset]
    assert inplace.plan(_file(big - 1, 10), min_size=big) == []
    # with no minimum, every tensor with data has a block, back to back: they cover the file
    small = inplace.plan(_file(5, 1000, 3), min_size=1)
    assert [(b.nbytes, b.end - b.start) for b in small] == [(0, 100), (5, 105), (1000, 1100),
                                                            (3, 3)]
    assert all(a.end == b.start for a, b in itertools.pairwise(small))
