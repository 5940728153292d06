"""Rank templates (``model-rank-%03d.tensors``, one file per tensor-parallel rank, as
vLLM writes them) loaded with ``group=``: spawned gloo ranks, real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_scenarios import break_rank, digest, steps
from safetensors.torch import save_file

from tensor_files import tensorizer_bytes
from tensorstream.testing.distributed import run_ranks


def _shards(folder: Path, count: int) -> list[dict[str, str]]:
    """``count`` files ``shard-000.tensors``...; each rank's tensors differ."""
    out = []
    for r in range(count):
        state = {"w": torch.full((10,), float(r)), "b": torch.arange(r + 3.0, r + 6.0)}
        (folder / f"shard-{r:03d}.tensors").write_bytes(tensorizer_bytes(state, folder))
        out.append({k: digest(v) for k, v in state.items()})
    return out


@pytest.mark.timeout(180)
def test_a_rank_template_is_filled_with_the_rank_in_the_group_passed(tmp_path: Path) -> None:
    """4 ranks, tensor-parallel groups [0, 1] and [2, 3] (vLLM's TP=2 with 2 pipeline
    stages), 2 shard files. With group=tp_group the template was filled with the global
    rank: ranks 2 and 3 asked for shard-002/-003 (NotFoundError), where vLLM fills it with
    the tensor-parallel rank. The rank in the group passed fills it now; the default
    group ("auto") still means the global rank, and rank=/world_size= that contradict
    the group are refused rather than silently preferred. A rank without its file fails
    every rank of the group."""
    shards = _shards(tmp_path, 2)
    template = str(tmp_path / "shard-%03d.tensors")
    shapes = {"w": [10], "b": [3]}
    # one file shared within each pair (no template): the broadcasts of group [2, 3]
    # come from global ranks 2 and 3
    gen = torch.Generator().manual_seed(7)
    whole = {f"t{i}": torch.randn(n, generator=gen) for i, n in enumerate([300_000, 5, 70_000])}
    (tmp_path / "whole.tensors").write_bytes(tensorizer_bytes(whole, tmp_path))
    save_file(whole, str(tmp_path / "whole.safetensors"))
    whole_digests = {k: digest(v) for k, v in whole.items()}
    todo = [
        {"label": "pair-tensorizer", "uri": str(tmp_path / "whole.tensors"), "group": "pair"},
        {"label": "pair-safetensors", "kind": "safetensors", "group": "pair",
         "uri": str(tmp_path / "whole.safetensors")},
        {"label": "tp", "uri": template, "group": "pair"},
        {"label": "tp-module", "kind": "module", "uri": template, "group": "pair",
         "shapes": shapes},
        {"label": "tp-config", "kind": "config", "uri": template, "group": "pair"},
        # a group of one: its only rank is rank 0
        {"label": "solo", "uri": template, "group": "solo"},
        # the default group: the global rank (4 ranks, 2 files: ranks 2 and 3 find none)
        {"label": "world", "uri": template, "group": "auto"},
        {"label": "after", "uri": template, "group": "pair"},  # the group still works
        {"label": "tp-same-rank", "uri": template, "group": "pair",
         "kwargs": [{"rank": r % 2, "world_size": 2} for r in range(4)]},
        {"label": "tp-other-rank", "uri": template, "group": "pair",
         "kwargs": [{"rank": 1 - r % 2} for r in range(4)]},
        {"label": "tp-other-size", "uri": template, "group": "pair",
         "kwargs": {"world_size": 4}},
    ]
    results = run_ranks(steps, 4, todo, timeout=150, group_timeout=30)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        mine = shards[r.rank % 2]
        for label in ("pair-tensorizer", "pair-safetensors"):
            assert r.value[label].get("digests") == whole_digests, (r.rank, label, r.value[label])
        for label in ("tp", "tp-config", "tp-same-rank"):
            assert r.value[label].get("digests") == mine, (r.rank, label, r.value[label])
        assert r.value["tp-module"].get("digests") == mine, (r.rank, r.value["tp-module"])
        # a group of one is a world of one, and shard-001 exists: it loaded shard-000 alone
        solo = r.value["solo"]
        assert solo.get("types", [None])[0] == "ConfigurationError", (r.rank, solo)
        assert "shard-001.tensors' exists, but 1 rank loads" in solo["error"], solo
        # 4 ranks, files for 2: ranks 0 and 1 returned their tensors and went on to
        # their next collective while 2 and 3 raised; every rank raises now
        world = r.value["world"]
        assert "DistributedLoadError" in world.get("types", []), (r.rank, world)
        assert world["failed_ranks"] == [2, 3], world
        assert "shard-002.tensors" in world["error"] and "shard-003.tensors" in world["error"]
        assert "NotFoundError" in world["error"] and "4-rank group" in world["error"], world
        # each names its rank of the 4 and what to do (fewer shards than ranks)
        assert "rank 2 of 4" in world["error"] and "rank 3 of 4" in world["error"], world
        assert "restore shard-002.tensors" in world["error"], world
        assert r.value["after"].get("digests") == mine, (r.rank, r.value["after"])
        for label, said in (("tp-other-rank", f"rank={1 - r.rank % 2}"),
                            ("tp-other-size", "world_size=4")):
            got = r.value[label]  # every rank's ConfigurationError, raised on every rank
            assert "DistributedLoadError" in got.get("types", []), (r.rank, label, got)
            assert got["failed_ranks"] == [0, 1], (r.rank, label, got)
            assert "ConfigurationError" in got["error"] and said in got["error"], got
            assert f"rank {r.rank % 2} of 2" in got["error"], got


@pytest.mark.timeout(120)
def test_a_rank_template_load_fails_on_every_rank_of_the_group(tmp_path: Path) -> None:
    """With group= and a rank template each rank reads its own file, and a failure was
    that rank's alone: rank 1 raised (its shard missing, its module another shape, its
    rank= contradicting the group) while rank 0 returned and went on to its next
    collective, waiting there for the group's whole timeout (30 min for gloo). Every
    rank raises DistributedLoadError naming rank 1's error now, and the group still
    loads afterwards. Ranks given different templates (one rank's stale configuration:
    shards of two saves) loaded them side by side without a word; every rank raises."""
    shards = _shards(tmp_path, 2)
    template = str(tmp_path / "shard-%03d.tensors")
    (tmp_path / "three").mkdir()
    _shards(tmp_path / "three", 3)
    (tmp_path / "again").mkdir()
    _shards(tmp_path / "again", 2)  # another save of the model, in another folder
    shapes = {"w": [10], "b": [3]}
    todo = [
        {"label": "missing", "uri": [template, str(tmp_path / "shard-%03d.absent")]},
        # 3 shards, 2 ranks: shard-002 was never loaded, without a word
        {"label": "more-shards", "uri": str(tmp_path / "three" / "shard-%03d.tensors")},
        # both ranks told rank=0 of 2: shard-001 loaded by no rank, without a word
        {"label": "same-shard", "uri": template, "kwargs": {"rank": 0, "world_size": 2}},
        # each its own (the default group's rank): nothing to say
        {"label": "own-shards", "uri": template, "kwargs": {"world_size": 2}},
        {"label": "module-differs", "kind": "module", "uri": template,
         "shapes": [shapes, {"w": [11], "b": [3]}]},
        {"label": "wrong-size", "uri": template, "group": "pair",
         "kwargs": [{}, {"world_size": 3}]},
        # rank 1 given another save's template: each loaded a shard, of two saves
        {"label": "other-templates",
         "uri": [template, str(tmp_path / "again" / "shard-%03d.tensors")]},
        # one template spelt two ways (a path, a file:// URI) is one template
        {"label": "two-spellings", "uri": [template, "file://" + template]},
        # str.format's placeholder is no template: one file for the group, not found
        {"label": "format-rank", "uri": str(tmp_path / "shard-{rank:03d}.tensors")},
        {"label": "lazy", "uri": template, "kwargs": {"lazy_load": True}},
        # a name that is wrong on every rank is each rank's ConfigurationError, as without
        # a group (it was a DistributedLoadError, no longer a ValueError)
        {"label": "two-templates", "uri": str(tmp_path / "r%03d" / "shard-%03d.tensors")},
        {"label": "too-wide", "uri": str(tmp_path / "shard-%099d.tensors")},
        {"label": "after", "uri": template},
    ]
    results = run_ranks(steps, 2, todo, timeout=90, group_timeout=20)
    assert all(r.ok for r in results), [(r.rank, r.error, r.traceback) for r in results]
    for r in results:
        for label, said in (("missing", "NotFoundError"), ("module-differs", "ModuleMismatch"),
                            ("wrong-size", "world_size=3")):
            got = r.value[label]
            assert "DistributedLoadError" in got.get("types", []), (r.rank, label, got)
            assert got["failed_ranks"] == [1], (r.rank, label, got)
            assert "rank 1: " in got["error"] and said in got["error"], (r.rank, label, got)
            assert got["seconds"] < 15, got
        same = r.value["same-shard"]
        assert same.get("digests") == shards[0], (r.rank, same)
        assert any("shard-001.tensors" in w and "no rank" in w and "ranks 0 and 1" in w
                   and "shard-000.tensors" in w for w in same["warnings"]), same["warnings"]
        other = r.value["other-templates"]  # every rank raises, naming its own template
        assert "DistributedLoadError" in other.get("types", []), (r.rank, other)
        assert "different rank templates" in other["error"], other
        assert "rank 0 one; rank 1 another" in other["error"], other
        mine = template if r.rank == 0 else str(tmp_path / "again" / "shard-%03d.tensors")
        assert f"this rank (rank {r.rank}) loaded {mine!r}" in other["error"], other
        spelt = r.value["two-spellings"]
        assert spelt.get("digests") == shards[r.rank], (r.rank, spelt)
        fmt = r.value["format-rank"]  # why the name was not found, and what to write
        assert fmt.get("failed_ranks") == [0, 1], (r.rank, fmt)
        assert "write '%03d' in place of '{rank:03d}'" in fmt["error"], fmt
        own = r.value["own-shards"]
        assert own.get("digests") == shards[r.rank] and not own["warnings"], (r.rank, own)
        more = r.value["more-shards"]
        assert "DistributedLoadError" in more.get("types", []), (r.rank, more)
        assert more["failed_ranks"] == [0, 1], more
        assert "shard-002.tensors' exists, but 2 ranks load" in more["error"], more
        for label in ("two-templates", "too-wide"):
            got = r.value[label]
            assert got.get("types", [])[0] == "ConfigurationError", (r.rank, label, got)
            assert "ValueError" in got["types"], got
        assert r.value["lazy"].get("digests") == shards[r.rank], (r.rank, r.value["lazy"])
        assert r.value["after"].get("digests") == shards[r.rank], (r.rank, r.value["after"])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["exit-own", "hang-own"])
def test_a_rank_that_dies_or_hangs_loading_its_shard_fails_the_others_in_bounded_time(
        tmp_path: Path, how: str) -> None:
    """Rank 1 exits (os._exit) or stops answering while it opens its own shard: rank 0,
    done with its own, raises DistributedLoadError (gloo sees the closed connection at
    once; a silent rank trips group_timeout=3) instead of waiting forever."""
    _shards(tmp_path, 2)
    step = {"label": "tp", "uri": str(tmp_path / "shard-%03d.tensors"),
            "kwargs": {"group_timeout": 3.0}}
    results = run_ranks(break_rank, 2, step, 1, how, timeout=60)
    assert results[0].raised("DistributedLoadError"), (results[0].error, results[0].traceback)
    assert "shard-%03d.tensors" in (results[0].error or ""), results[0].error
    assert "group_timeout= above the slowest rank's read" in (results[0].error or "")
    assert results[0].seconds < 9, results[0].seconds
    assert not results[0].hung and not results[1].hung
