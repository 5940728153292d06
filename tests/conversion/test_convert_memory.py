"""tensorstream.convert holds bounded memory: one batch and one tensor to tensorizer, each batch
released to safetensors."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import assert_same, tensorizer_read

import tensorstream

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


def _alive(refs: list[weakref.ref[Any]]) -> int:
    gc.collect()
    return sum(r() is not None for r in refs)


@pytest.mark.parametrize(("batch", "bound"), [(1, 2), (2048, 3)])
def test_to_tensorizer_holds_one_batch_and_one_tensor(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      batch: int, bound: int) -> None:
    from tensorstream.conversion import to_tensorizer
    from tensorstream.safetensors.reader import SafetensorsFile

    # 1 KiB tensors: batches of one, then of two tensors
    monkeypatch.setattr(to_tensorizer, "BATCH_BYTES", batch)
    want = {f"t{i:02d}": torch.full((256,), float(i)) for i in range(6)}
    st_torch.save_file(want, str(tmp_path / "m.safetensors"))
    refs: list[weakref.ref[Any]] = []
    most = [0]
    real = SafetensorsFile.read_tensor

    def spy(self: Any, *a: Any, **kw: Any) -> Any:
        most[0] = max(most[0], _alive(refs))  # before this one is allocated
        t = real(self, *a, **kw)
        refs.append(weakref.ref(t))
        return t

    monkeypatch.setattr(SafetensorsFile, "read_tensor", spy)
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert len(refs) == 6 and most[0] <= bound
    assert_same(tensorizer_read((tmp_path / "m.tensors").read_bytes()), want)


def test_to_safetensors_releases_each_batch(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorstream.conversion import to_safetensors

    want = {f"t{i:02d}": torch.full((1024,), float(i)) for i in range(6)}
    tensorstream.serialize(want, str(tmp_path / "m.tensors"))
    monkeypatch.setattr(to_safetensors, "BATCH_BYTES", 8192)  # two tensors per batch
    refs: list[weakref.ref[Any]] = []
    most = [0]
    real = to_safetensors._load

    def spy(*a: Any, **kw: Any) -> Any:
        most[0] = max(most[0], _alive(refs))  # what earlier batches left loaded
        got = real(*a, **kw)
        refs.extend(weakref.ref(t) for t in got.values())
        return got

    monkeypatch.setattr(to_safetensors, "_load", spy)
    tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    assert len(refs) == 6 and most[0] == 0  # tensorizer's cache let go of every batch
    assert_same(st_torch.load_file(str(tmp_path / "m.safetensors")), want)
