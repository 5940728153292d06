"""Fails loudly when tensorizer's private hooks (used for parallel readers) change."""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import torch
from tensorizer import TensorDeserializer, TensorSerializer

import tensorstream
from tensorstream.tensorizer.hook import (
    StreamTensorDeserializer,
    check_compat,
    reader_count,
    tensor_names,
)


def test_private_hooks_have_the_expected_shape() -> None:
    check_compat()  # raises RuntimeError naming what changed
    hook = TensorDeserializer._reopen_func
    assert list(inspect.signature(hook).parameters) == ["self"]
    assert StreamTensorDeserializer._reopen_func is not hook


def _write(path: Path) -> dict[str, torch.Tensor]:
    sd = {f"t{i}": torch.full((256, 64), float(i)) for i in range(6)}
    s = TensorSerializer(str(path))
    s.write_state_dict(sd)
    s.close()
    return sd


def test_stream_sources_get_parallel_readers(tmp_path: Path) -> None:
    sd = _write(tmp_path / "m.tensors")
    with tensorstream.open(tmp_path / "m.tensors") as f:
        d = StreamTensorDeserializer(f, device="cpu", num_readers=3, lazy_load=True)
        reopen = d._reopen_func()
        assert reopen is not None
        fork = reopen(begin=1234, end=5000)
        try:
            # a fork of the stream, behind the same checks as the stream itself
            assert isinstance(fork.inner, tensorstream.StreamReader) and fork.tell() == 1234
        finally:
            fork.close()
        assert reader_count(d) == 3
        assert tensor_names(d) == list(sd)
        for k, v in sd.items():
            assert torch.equal(d[k], v)
        d.close()


def test_other_sources_keep_tensorizer_behaviour(tmp_path: Path) -> None:
    _write(tmp_path / "m.tensors")
    buf = io.BytesIO((tmp_path / "m.tensors").read_bytes())
    d = StreamTensorDeserializer(buf, device="cpu", lazy_load=True)
    assert d._reopen_func() is None  # BytesIO cannot be reopened
    assert reader_count(d) == 1
    d.close()


def test_read_ahead_window_returns_exact_bytes_for_tensorizer_access_patterns(
    tmp_path: Path,
) -> None:
    import random

    data = random.Random(7).randbytes(3 << 20)
    (tmp_path / "blob").write_bytes(data)
    rng = random.Random(1)
    with tensorstream.open(tmp_path / "blob", readahead=256 << 10) as f:
        for _ in range(400):  # header-sized, tensor-sized and straddling reads
            pos = rng.randrange(len(data))
            n = rng.choice([1, 8, 100, 5000, 70_000, 300_000, 1 << 20])
            f.seek(pos)
            buf = bytearray(n)
            got = f.readinto(buf)
            assert bytes(buf[:got]) == data[pos : pos + n]
