"""What a tensorizer file claims is checked before it is allocated (tensorizer/claims.py).

A *meta* tensor (written without data, loaded as zeros) costs nothing in the
file: a file of a few hundred KB can claim terabytes. The files here are real
tensorizer files (written by tensorizer from tensors on the ``meta`` device),
served from a local path and by a real HTTP server on loopback.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorizer import TensorSerializer

import tensorstream
from tensorstream import errors

TIB = 1 << 40


def _file(tmp_path: Path, meta_elements: int) -> bytes:
    """A float32 meta tensor ``a`` of ``meta_elements`` and a real tensor ``b`` of 3."""
    path = tmp_path / "claims.tensors"
    ser = TensorSerializer(str(path))
    ser.write_state_dict({"a": torch.empty(meta_elements, device="meta"),
                          "b": torch.arange(3, dtype=torch.float32)})
    ser.close()
    data = path.read_bytes()
    path.unlink()
    return data


@pytest.fixture(params=["local", "http"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """``place(data) -> (uri, options)``: the bytes as a local file or over HTTP."""
    def put(data: bytes) -> tuple[str, dict[str, Any]]:
        if request.param == "local":
            path = tmp_path / "model.tensors"
            path.write_bytes(data)
            return str(path), {}
        server = request.getfixturevalue("http_server")
        key = f"claims{abs(hash(request.node.nodeid)) % 10**8}/model.tensors"
        server.put(key, data)
        return server.url(key), dict(server.options)

    return put


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_meta_tensor_claiming_a_terabyte_is_refused_before_allocating(
        place: Any, tmp_path: Path) -> None:
    data = _file(tmp_path, TIB // 4)  # 1 TiB of float32 zeros, in a file of ~260 KB
    assert len(data) < 1 << 20
    uri, opts = place(data)
    before = _peak_mib()
    for mode in ({}, {"num_readers": 1}, {"lazy_load": True}):
        with pytest.raises(errors.InsufficientMemoryError) as info:
            with tensorstream.deserialize(uri, device="cpu", **mode, **opts) as d:
                d["a"]  # a lazy load allocates on access
        err = info.value
        assert isinstance(err, MemoryError) and isinstance(err, errors.LoadError)
        assert err.claimed >= TIB and err.limit < TIB
        text = str(err)
        assert "model.tensors" in text and "meta tensors" in text and "max_tensor_bytes" in text
        assert str(err.claimed) in text and str(err.limit) in text
    assert _peak_mib() - before < 256  # refused, not allocated and failed


def test_max_tensor_bytes_is_an_allowance_of_the_callers(place: Any, tmp_path: Path) -> None:
    uri, opts = place(_file(tmp_path, 16 << 20))  # 64 MiB of zeros
    with pytest.raises(errors.InsufficientMemoryError) as info:
        tensorstream.deserialize(uri, device="cpu", max_tensor_bytes="1MiB", **opts)
    assert info.value.limit == 1 << 20 and info.value.claimed == (64 << 20) + 12
    assert "max_tensor_bytes=1048576" in str(info.value)
    with tensorstream.deserialize(uri, device="cpu", max_tensor_bytes=(64 << 20) + 12,
                                  **opts) as d:
        assert d["a"].shape == (16 << 20,) and not d["a"].any()
        assert d["b"].tolist() == [0.0, 1.0, 2.0]
    # A lazy load is checked at each access: what fits loads, what does not is refused.
    with tensorstream.deserialize(uri, device="cpu", max_tensor_bytes=1024, lazy_load=True,
                                  **opts) as d:
        with pytest.raises(errors.InsufficientMemoryError):
            d["a"]
    with tensorstream.deserialize(uri, device="cpu", max_tensor_bytes=1024, lazy_load=True,
                                  filter_func=lambda name: name == "b", **opts) as d:
        assert d["b"].tolist() == [0.0, 1.0, 2.0]


def test_the_allowance_counts_tensors_with_data_too(tmp_path: Path) -> None:
    path = tmp_path / "real.tensors"
    ser = TensorSerializer(str(path))
    ser.write_state_dict({"w": torch.ones(1024)})  # 4096 bytes of data
    ser.close()
    with pytest.raises(errors.InsufficientMemoryError):
        tensorstream.deserialize(str(path), device="cpu", max_tensor_bytes=4095)
    with tensorstream.deserialize(str(path), device="cpu", max_tensor_bytes=4096) as d:
        assert d["w"].sum().item() == 1024


@pytest.mark.parametrize("bad", ["lots", -1, 1.5])
def test_a_bad_allowance_is_a_configuration_error(tmp_path: Path, bad: Any) -> None:
    path = tmp_path / "m.tensors"
    path.write_bytes(_file(tmp_path, 4))
    with pytest.raises(errors.ConfigurationError, match="max_tensor_bytes must be"):
        tensorstream.deserialize(str(path), device="cpu", max_tensor_bytes=bad)


def test_a_meta_tensor_of_a_dtype_numpy_lacks_is_named_not_called_damaged(tmp_path: Path) -> None:
    # tensorizer writes it, then sizes it with numpy.dtype("<V2\\0torch.bfloat16") and fails:
    # the file was called "not a whole tensorizer file" (damaged). It is tensorizer's limit.
    path = tmp_path / "bf16meta.tensors"
    ser = TensorSerializer(str(path))
    ser.write_state_dict({"a": torch.empty(4, dtype=torch.bfloat16, device="meta"),
                          "b": torch.ones(2)})
    ser.close()
    with pytest.raises(errors.LoadError) as info:
        tensorstream.deserialize(str(path), device="cpu")
    assert not isinstance(info.value, errors.MalformedFileError)
    text = str(info.value)
    assert "bf16meta.tensors" in text and "torch.bfloat16" in text and "filter_func" in text
    with tensorstream.deserialize(str(path), device="cpu", filter_func=lambda n: n != "a") as d:
        assert d["b"].tolist() == [1.0, 1.0]


def test_a_meta_shape_past_int64_is_a_damaged_file(tmp_path: Path) -> None:
    # (2**32-1) x (2**32-1) float32: tensorizer's numpy.prod wrapped around to a negative
    # size and failed an assert ("not a whole tensorizer file: AssertionError: ")
    import struct

    path = tmp_path / "shape.tensors"
    ser = TensorSerializer(str(path))
    ser.write_state_dict({"a": torch.empty(5, 7, device="meta"), "b": torch.ones(3)})
    ser.close()
    data = path.read_bytes()
    dims = struct.pack("<II", 5, 7)
    assert data.count(dims) == 2  # the index and the tensor's header
    path.write_bytes(data.replace(dims, struct.pack("<II", 2**32 - 1, 2**32 - 1)))
    for mode in ({}, {"lazy_load": True}):
        with pytest.raises(errors.MalformedFileError, match=r"shape \(4294967295, 4294967295\)"):
            with tensorstream.deserialize(str(path), device="cpu", **mode) as d:
                d["a"]
