"""The status collective every rank joins: a rank's error text is packed for it
without raising, so a failure on one rank fails every rank and the group goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from dist_scenarios import digest, steps

from tensor_files import tensorizer_bytes
from tensorstream.distributed.exchange import _MESSAGE, _describe
from tensorstream.errors import NotFoundError
from tensorstream.testing.distributed import run_ranks

st_torch = pytest.importorskip("safetensors.torch")


def test_an_error_text_that_is_not_utf8_is_described_without_raising() -> None:
    # a file name that is not UTF-8 reaches Python as a lone surrogate
    text = _describe(NotFoundError("no such file: /models/\udcff" + "x" * 1000))
    assert text.startswith("NotFoundError: no such file: /models/\\udcff")
    assert len(text.encode()) <= _MESSAGE  # what the collective carries


def test_a_long_error_text_keeps_its_start_and_its_advice() -> None:
    """A rank's error with a long path in the middle: the collective carries 400
    bytes, and the first 400 lost the advice at the end ("load it without group=")."""
    error = NotFoundError("no such file: /models/" + "d/" * 400 + "m.tensors; load it "
                          "without group= to see the whole error")
    text = _describe(error)
    assert len(text.encode()) <= _MESSAGE
    assert text.startswith("NotFoundError: no such file: /models/d/")
    assert text.endswith("load it without group= to see the whole error")
    assert " ... " in text
    short = _describe(NotFoundError("no such file: /m.tensors"))
    assert short == "NotFoundError: no such file: /m.tensors"  # untouched when it fits


@pytest.mark.timeout(120)
def test_a_rank_failing_on_a_name_that_is_not_utf8_fails_every_rank(tmp_path: Path) -> None:
    """Rank 1 asks for a missing file whose name is not UTF-8: packing its error
    raised UnicodeEncodeError on rank 1 alone, before the status collective, so
    rank 1 went on to its next load while rank 0 waited in a collective that rank
    1's next load then answered. Every rank raises DistributedLoadError naming
    rank 1's NotFoundError now, and the group still loads afterwards."""
    state = {"w": torch.arange(1000.0), "b": torch.ones(3, dtype=torch.bfloat16)}
    expected = {k: digest(v) for k, v in state.items()}
    good = tmp_path / "m.tensors"
    good.write_bytes(tensorizer_bytes(state, tmp_path))
    good_st = tmp_path / "m.safetensors"
    good_st.write_bytes(st_torch.save(state))
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xff-missing")
    options = {"group_timeout": 20}
    todo = [
        {"label": "tensorizer", "uri": [str(good), bad + ".tensors"], "kwargs": options},
        {"label": "safetensors", "kind": "safetensors", "kwargs": options,
         "uri": [str(good_st), bad + ".safetensors"]},
        {"label": "after", "uri": str(good), "kwargs": options},
    ]
    results = run_ranks(steps, 2, todo, timeout=90)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        for label in ("tensorizer", "safetensors"):
            failed = r.value[label]
            assert "DistributedLoadError" in failed.get("types", []), (r.rank, failed)
            assert failed["failed_ranks"] == [1], (r.rank, failed)
            assert "rank 1: NotFoundError" in failed["error"], (r.rank, failed)
            assert failed["seconds"] < 15, (r.rank, failed)
        assert r.value["after"].get("digests") == expected, (r.rank, r.value["after"])


@pytest.mark.timeout(120)
def test_local_copies_on_each_machine_are_named_as_the_cause(tmp_path: Path) -> None:
    """Ranks on two machines, each with its own byte-identical copy of the model on its
    local disk (two paths here): the copies are two versions (inode, mtime) and the load
    is refused, as it must be, but the message only said the ranks "do not see the same
    object"; it now says why local copies differ and to load them with group=None, and
    which ranks saw which object."""
    state = {"w": torch.arange(1000.0)}
    data, sdata = tensorizer_bytes(state, tmp_path), st_torch.save(state)
    for r in range(2):
        (tmp_path / f"node{r}.tensors").write_bytes(data)
        (tmp_path / f"node{r}.safetensors").write_bytes(sdata)
    todo = [
        {"label": "tensorizer", "uri": [str(tmp_path / f"node{r}.tensors") for r in range(2)]},
        {"label": "safetensors", "kind": "safetensors",
         "uri": [str(tmp_path / f"node{r}.safetensors") for r in range(2)]},
    ]
    results = run_ranks(steps, 2, todo, timeout=90, group_timeout=20)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        for label in ("tensorizer", "safetensors"):
            failed = r.value[label]
            assert "DistributedLoadError" in failed.get("types", []), (r.rank, failed)
            assert "do not see the same object" in failed["error"], failed
            # which rank saw which, so the odd one out can be found in a larger group
            assert f"(rank 0 saw one; rank 1 another; this is rank {r.rank})" in failed["error"]
            assert "copies on several machines" in failed["error"], failed
            assert "group=None" in failed["error"], failed
