"""Dtypes safetensors knows and torch lacks (F6_E2M3, F6_E3M2: FP6, four to three bytes):
the file opens as ``safe_open`` opens it (names, dtypes, shapes, every other tensor), and
such a tensor itself is an error naming the file and the tensor, never bytes read as
something else."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from stores import make_store
from tensorstream.errors import MalformedFileError, UnsupportedOperationError

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
safetensors = pytest.importorskip("safetensors")

from tensor_files import same_bytes  # noqa: E402  (needs torch)

ts_st = tensorstream.safetensors

#: An F32 tensor between two FP6 ones (3 bytes hold 4 elements): 3 + 8 + 6 bytes of data.
_HEADER = {"__metadata__": {"format": "pt"},
           "q": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]},
           "a": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
           "r": {"dtype": "F6_E3M2", "shape": [2, 4], "data_offsets": [11, 17]}}
_DATA = b"\x01\x02\x03" + struct.pack("<2f", 1.5, -2.0) + bytes(range(10, 16))


def _file(header: dict[str, Any], data: bytes) -> bytes:
    body = json.dumps(header).encode()
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body + data


@pytest.mark.parametrize("backend_name", ["local", "http"])
def test_a_file_holding_fp6_tensors_opens_as_safe_open_opens_it(
        backend_name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """safetensors 0.8 reads FP6 headers (torch has no dtype for them): ``safe_open`` lists
    the file, reads its other tensors and tells an FP6 tensor's dtype and shape. Here the
    whole file was refused ("unsupported dtype 'F6_E2M3'") by ``open``, ``load`` (with a
    filter leaving the FP6 tensors out too) and ``inspect``."""
    local = tmp_path / "fp6.safetensors"
    local.write_bytes(_file(_HEADER, _DATA))
    backend = make_store(backend_name, request, tmp_path / "store")
    backend.put("fp6.safetensors", local.read_bytes())
    uri, options = backend.uri("fp6.safetensors"), backend.options
    with safetensors.safe_open(str(local), "pt") as ref:
        keys, a = ref.keys(), ref.get_tensor("a")
        assert (ref.get_slice("q").get_dtype(), ref.get_slice("q").get_shape()) == ("F6_E2M3", [4])
    with ts_st.open(uri, **options) as f:
        assert f.keys() == keys == ["a", "q", "r"] and f.metadata() == {"format": "pt"}
        assert same_bytes(f.get_tensor("a"), a)
        assert (f.get_slice("r").get_dtype(), f.get_slice("r").get_shape()) == ("F6_E3M2", [2, 4])
        assert f.info("q").nbytes == 3 and f.info("r").nbytes == 6
        for read in (lambda: f.get_tensor("q"), lambda: f.get_slice("r")[1]):
            with pytest.raises(UnsupportedOperationError,
                               match=r"fp6\.safetensors: tensor '[qr]' is F6_E[23]M[32]"):
                read()
    assert same_bytes(ts_st.load(uri, filter=["a"], **options)["a"], a)
    assert same_bytes(dict(ts_st.iter_tensors(uri, filter=["a"], **options))["a"], a)
    info = tensorstream.inspect(uri, **options)
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in info.tensors] == [
        ("q", "F6_E2M3", (4,), 3), ("a", "F32", (2,), 8), ("r", "F6_E3M2", (2, 4), 6)]
    # The whole file: refused before a byte is read, naming the tensor and what to do.
    for load in (lambda: ts_st.load(uri, **options),
                 lambda: dict(ts_st.iter_tensors(uri, **options))):
        with pytest.raises(UnsupportedOperationError,
                           match=r"fp6\.safetensors: tensor 'q' is F6_E2M3.*leave it out"):
            load()
    with pytest.raises(Exception, match="F6_E2M3"):  # so does the reference
        st_torch.load_file(str(local))


@pytest.mark.parametrize(("shape", "span"), [([3], 3), ([3], 2), ([4], 4), ([5], 4)])
def test_an_fp6_shape_that_does_not_fill_its_bytes_is_malformed(
        tmp_path: Path, shape: list[int], span: int) -> None:
    """Neighbours: FP6 elements that end inside a byte (3 x 6 bits), or fill more or fewer
    bytes than the span, are refused as the reference refuses them."""
    path = tmp_path / "bad.safetensors"
    path.write_bytes(_file({"q": {"dtype": "F6_E2M3", "shape": shape,
                                  "data_offsets": [0, span]}}, b"\0" * span))
    for attempt in (ts_st.load, ts_st.open, tensorstream.inspect):
        with pytest.raises(MalformedFileError, match=r"bad\.safetensors: tensor 'q'.*span"):
            attempt(path)
    with pytest.raises(Exception):  # noqa: B017 - any error from the reference
        safetensors.safe_open(str(path), "pt")
