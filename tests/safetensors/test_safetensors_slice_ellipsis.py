"""``open(...).get_slice(name)[key]`` with more than one ``...``, against safetensors'
own ``safe_open`` on the same local file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tensorstream

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
safetensors = pytest.importorskip("safetensors")

E = Ellipsis
KEYS: list[Any] = [
    (E, E), (E, E, E), (E, 0, E), (E, 1, E, slice(0, 1)), (E, slice(1, 2), E, slice(None)),
    (E, 0, 1, 2, E), (0, E, E), (E, E, slice(0, 1)), (E, E, -1),
    # refused by safetensors (and torch): an index past the tensor's dimensions
    (E, 1, E, 2), (slice(None), E, E, 1), (E, E, slice(1, None)), (0, E, E, slice(None, None, 2)),
    (E, 0, 1, 2, 3),
]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_two_ellipses_in_a_slice_as_safetensors_takes_them(tmp_path: Path, key: Any) -> None:
    """``get_slice(name)[..., ...]`` raised IndexError ('a single ellipsis') where
    safetensors' get_slice (and torch) take each ``...`` for the dimensions the other
    indices leave; now the same rows, or the same kind of error where it refuses."""
    path = tmp_path / "m.safetensors"
    st_torch.save_file({"a": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)}, str(path))
    with safetensors.safe_open(str(path), "pt") as theirs, tensorstream.safetensors.open(
            path) as ours:
        try:
            want = theirs.get_slice("a")[key]
        except IndexError:
            with pytest.raises(IndexError):
                ours.get_slice("a")[key]
            return
        got = ours.get_slice("a")[key]
        assert got.shape == want.shape and torch.equal(got, want), (got, want)


def test_two_ellipses_with_an_index_that_is_no_position_still_say_so(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    st_torch.save_file({"a": torch.zeros(2, 3)}, str(path))
    with tensorstream.safetensors.open(path) as ours:
        with pytest.raises(TypeError, match="a bool is a mask"):
            ours.get_slice("a")[..., True, ...]
        with pytest.raises(TypeError, match="use integers, slices"):
            ours.get_slice("a")[..., "x", ...]
