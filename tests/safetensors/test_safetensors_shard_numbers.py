"""A folder's numbered shards (``model-0000N-of-0000M.safetensors``, no index) past their
total: a shard numbered beyond ``M`` (``-00005-of-00004``) belongs to no set of ``M``, so
a folder holding one is refused by name at every door, not loaded as one more file
(src/tensorstream/safetensors/sources.py). Local files and moto on loopback."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.errors import MalformedFileError

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


def _folder(name: str, request: pytest.FixtureRequest, tmp_path: Path,
            numbers: list[int], total: int) -> tuple[str, dict[str, Any]]:
    """A folder holding ``model-{n}-of-{total}`` for each n, each with a tensor ``tN``."""
    files = {f"model-{n:05d}-of-{total:05d}.safetensors":
             st_torch.save({f"t{n}": torch.full((2,), float(n))}) for n in numbers}
    if name == "local":
        for k, data in files.items():
            (tmp_path / k).write_bytes(data)
        return str(tmp_path), {}
    s3 = request.getfixturevalue("moto_s3")
    prefix = f"shardnum-{secrets.token_hex(4)}"
    for k, data in files.items():
        s3.put(S3_BUCKET, f"{prefix}/{k}", data)
    return f"s3://{S3_BUCKET}/{prefix}/", s3.options()


def _doors(folder: str, options: dict[str, Any]) -> list[Callable[[], object]]:
    return [lambda: tensorstream.safetensors.load(folder, **options),
            lambda: dict(tensorstream.safetensors.iter_tensors(folder, **options)),
            lambda: tensorstream.safetensors.open(folder, **options).keys(),
            lambda: tensorstream.inspect(folder, **options)]


@pytest.mark.parametrize("name", ["local", "s3"])
def test_a_shard_numbered_past_its_total_next_to_a_whole_set_is_refused_by_name(
        name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``model-00005-of-00004`` beside the whole set 1-4 loaded as an ordinary file (its
    tensors with the set's). Refused now, naming it and the set's numbers."""
    folder, options = _folder(name, request, tmp_path, [1, 2, 3, 4, 5], 4)
    for door in _doors(folder, options):
        with pytest.raises(MalformedFileError,
                           match=r"model-00005-of-00004\.safetensors.* past"):
            door()


@pytest.mark.parametrize(("numbers", "total", "stray"), [
    ([0, 1, 2, 3, 4], 4, "00004"),  # numbered from 0 (it holds -00000-): 4 is past 0-3
    ([2, 7], 3, "00007"),  # past the total either way (and the set is cut too)
    ([9], 3, "00009"),  # no set beside it
])
def test_the_neighbours_past_the_total_are_refused_too(
        tmp_path: Path, request: pytest.FixtureRequest, numbers: list[int], total: int,
        stray: str) -> None:
    folder, options = _folder("local", request, tmp_path, numbers, total)
    with pytest.raises(MalformedFileError, match=rf"model-{stray}-of-{total:05d}\.safetensors"):
        tensorstream.safetensors.load(folder, **options)


@pytest.mark.parametrize(("numbers", "total"), [([1, 2, 3, 4], 4), ([0, 1, 2, 3], 4),
                                                ([1], 1), ([0], 1)])
def test_whole_sets_numbered_from_1_or_from_0_still_load(
        tmp_path: Path, request: pytest.FixtureRequest, numbers: list[int],
        total: int) -> None:
    folder, options = _folder("local", request, tmp_path, numbers, total)
    got = tensorstream.safetensors.load(folder, **options)
    assert sorted(got) == sorted(f"t{n}" for n in numbers)
    assert all(torch.equal(got[f"t{n}"], torch.full((2,), float(n))) for n in numbers)
