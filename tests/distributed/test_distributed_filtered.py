"""Filtered tensorizer group loads (``filter_func`` with ``group=``) hold only the
bytes they need: the file's headers and the tensors the filter keeps, not the
whole file. 2 spawned gloo ranks load real tensorizer files from local disk;
what they build is compared with a load without ``group=``."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_scenarios import FILTERS, digest, steps
from tensorizer import TensorDeserializer

import tensorstream
from tensor_files import tensorizer_bytes
from tensorstream.testing.distributed import run_ranks

TIB = 1 << 40


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(38)
    state = {f"layer{i}.w": torch.randn(n, generator=gen)
             for i, n in enumerate([65536, 3, 131072, 1000])}
    state["big"] = torch.randn(7, 10007, generator=gen)  # last in the file
    return state


def _claiming_file(folder: Path) -> Path:
    """A real tensorizer file of :func:`_state` whose index says its last tensor,
    ``big``, is 2**19 x 2**19 float32 (1 TiB), backed by 1 TiB of holes (a sparse
    file): a file far larger than memory, whose other tensors are small."""
    path = folder / "huge.tensors"
    data = bytearray(tensorizer_bytes(_state(), folder))
    path.write_bytes(data)
    with TensorDeserializer(str(path), lazy_load=True) as index:
        big = max(index._metadata.values(), key=lambda e: e.offset)
    for old, new in ((struct.pack("<II", 7, 10007), struct.pack("<II", 1 << 19, 1 << 19)),
                     (struct.pack("<Q", big.data_length), struct.pack("<Q", TIB))):
        at = data.find(old)
        assert 0 < at < big.offset and data.find(old, at + 1) > big.offset  # the index's copy
        data[at : at + len(old)] = new
    path.write_bytes(data)
    with open(path, "r+b") as f:
        f.truncate(big.data_offset + TIB)
    return path


def _plain(uri: str, filter_name: str | None, **kwargs: Any) -> dict[str, str]:
    """What a load without group= builds."""
    if filter_name is not None:
        kwargs["filter_func"] = FILTERS[filter_name]
    with tensorstream.deserialize(uri, device="cpu", **kwargs) as sd:
        return {k: digest(sd[k]) for k in sd}


def _refused_as_alone(failed: dict[str, Any]) -> None:
    """A filter keeping no tensor: every rank's ConfigurationError, as without group=."""
    assert "DistributedLoadError" in failed["types"], failed
    assert failed["failed_ranks"] == [0, 1], failed
    assert failed["error"].count("ConfigurationError: filter_func selected none") == 2, failed


@pytest.mark.timeout(240)
def test_a_filtered_group_load_of_a_file_larger_than_memory_holds_only_its_tensors(
        tmp_path: Path) -> None:
    """The group held the whole file: a filter keeping 0.8 MB of a 1 TiB file was
    every rank's InsufficientMemoryError ("the whole file"), while the same load
    without group= worked. Its neighbours: a filter keeping nothing (refused as
without group=); one keeping
    the 1 TiB tensor, or no filter, is still refused before anything is allocated."""
    huge = _claiming_file(tmp_path)
    assert huge.stat().st_size > TIB and huge.stat().st_blocks * 512 < 64 << 20
    expected = _plain(str(huge), "not_big")
    assert sorted(expected) == sorted(k for k in _state() if k != "big")
    with pytest.raises(tensorstream.errors.ConfigurationError, match="selected none"):
        _plain(str(huge), "keep_none")
    todo = [
        {"label": "not-big", "uri": str(huge), "kwargs": {"filter_func": "not_big"}},
        {"label": "none", "uri": str(huge), "kwargs": {"filter_func": "keep_none"}},
        {"label": "big", "uri": str(huge), "kwargs": {"filter_func": "only_big"}},
        {"label": "everything", "uri": str(huge)},
        {"label": "big-lazy", "uri": str(huge),
         "kwargs": {"filter_func": "only_big", "lazy_load": True}},
        {"label": "after", "uri": str(huge), "kwargs": {"filter_func": "not_big"}},
    ]
    results = run_ranks(steps, 2, todo, timeout=200)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        assert r.value["not-big"].get("digests") == expected, r.value["not-big"].get("error")
        stats = r.value["not-big"]["stats"]
        # this rank's share of the ~0.8 MB kept (and its index read), not of 1 TiB
        assert stats["path"] == "group" and stats["bytes"] < 1 << 20, stats
        _refused_as_alone(r.value["none"])
        # 1 TiB kept: refused as the ranks open the file (an eager load's tensors are
        # checked as without group=; a lazy load's, the buffer it would hold)
        for label in ("big", "everything", "big-lazy"):
            failed = r.value[label]
            assert "DistributedLoadError" in failed["types"], failed
            assert failed["failed_ranks"] == [0, 1], failed
            assert failed["error"].count("InsufficientMemoryError") == 2, failed
            step = "reading" if label == "big-lazy" else "opening"  # both before any read
            assert failed["error"].startswith(f"DistributedLoadError: {step} "), failed
            count = len(_state()) if label == "everything" else 1
            assert f"{count} tensor(s) to load claim 10995" in failed["error"], failed["error"]
        assert "without group=" in r.value["big-lazy"]["error"], r.value["big-lazy"]["error"]
        assert r.value["after"].get("digests") == expected  # the group still works


@pytest.mark.timeout(240)
def test_filters_keeping_everything_or_nothing_or_differing_between_ranks(
        tmp_path: Path) -> None:
    """A filter keeping every tensor loads exactly what no filter loads; one
    keeping none is refused as without group=; ranks whose filters keep different tensors are
    refused on every rank before any byte is exchanged (their buffers would
    differ), naming filter_func. An encrypted file, filtered and hash-checked,
    reads nothing the plan left out either. Kept tensors over max_tensor_bytes
    are refused before any share is read."""
    path = tmp_path / "model.tensors"
    path.write_bytes(tensorizer_bytes(_state(), tmp_path))
    everything = _plain(str(path), None)
    assert _plain(str(path), "keep_all") == everything
    key = bytes(range(32))
    encrypted = tmp_path / "encrypted.tensors"
    tensorstream.serialize(_state(), encrypted, encryption=key)
    some = _plain(str(encrypted), "only_layer1", encryption=key, verify_hash=True)
    assert sorted(some) == ["layer1.w"]
    todo = [
        {"label": "all", "uri": str(path), "kwargs": {"filter_func": "keep_all"}},
        {"label": "none", "uri": str(path), "kwargs": {"filter_func": "keep_none"}},
        {"label": "differ", "uri": str(path),
         "kwargs": [{"filter_func": "not_big"}, {"filter_func": "only_layer1"}]},
        {"label": "lazy", "uri": str(path),
         "kwargs": {"filter_func": "only_layer1", "lazy_load": True, "num_readers": 2}},
        {"label": "encrypted", "uri": str(encrypted),
         "kwargs": {"filter_func": "only_layer1", "encryption": key, "verify_hash": True}},
        {"label": "allowance", "uri": str(path),
         "kwargs": {"filter_func": "not_big", "max_tensor_bytes": 100_000}},
    ]
    results = run_ranks(steps, 2, todo, timeout=200)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        assert r.value["all"].get("digests") == everything, r.value["all"]
        _refused_as_alone(r.value["none"])
        differ: dict[str, Any] = r.value["differ"]
        assert "DistributedLoadError" in differ["types"], differ
        assert "filter_func differ between ranks" in differ["error"], differ
        assert r.value["lazy"].get("digests") == {
            k: v for k, v in everything.items() if k.startswith("layer1")}, r.value["lazy"]
        assert r.value["encrypted"].get("digests") == some, r.value["encrypted"].get("error")
        # kept tensors over max_tensor_bytes: refused when the ranks open the file, before
        # any share is read (it was after the whole exchange)
        over = r.value["allowance"]
        assert over.get("error", "").startswith("DistributedLoadError: opening "), over
        assert over["error"].count("InsufficientMemoryError") == 2, over["error"]
        assert "max_tensor_bytes=100000" in over["error"], over["error"]
