"""Rank templates (``model-rank-%03d.tensors``, one file per tensor-parallel rank, as
vLLM writes them) loaded with ``group=``: spawned gloo ranks, real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_scenarios import digest, steps

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
    the group are refused rather than silently preferred."""
    shards = _shards(tmp_path, 2)
    template = str(tmp_path / "shard-%03d.tensors")
    shapes = {"w": [10], "b": [3]}
    todo = [
        {"label": "tp", "uri": template, "group": "pair"},
        {"label": "tp-module", "kind": "module", "uri": template, "group": "pair",
         "shapes": shapes},
        {"label": "tp-config", "kind": "config", "uri": template, "group": "pair"},
        # a group of one: its only rank is rank 0
        {"label": "solo", "uri": template, "group": "solo"},
        # the default group: the global rank (4 ranks, 2 files: ranks 2 and 3 find none)
        {"label": "world", "uri": template, "group": "auto"},
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
        for label in ("tp", "tp-config", "tp-same-rank"):
            assert r.value[label].get("digests") == mine, (r.rank, label, r.value[label])
        assert r.value["tp-module"].get("digests") == mine, (r.rank, r.value["tp-module"])
        assert r.value["solo"].get("digests") == shards[0], (r.rank, r.value["solo"])
        world = r.value["world"]
        if r.rank < 2:
            assert world.get("digests") == shards[r.rank], (r.rank, world)
        else:
            assert "NotFoundError" in world["types"], (r.rank, world)
            assert f"shard-{r.rank:03d}.tensors" in world["error"], world
        for label, said in (("tp-other-rank", f"rank={1 - r.rank % 2}"),
                            ("tp-other-size", "world_size=4")):
            got = r.value[label]
            assert "ConfigurationError" in got.get("types", []), (r.rank, label, got)
            assert said in got["error"] and f"rank {r.rank % 2} of 2" in got["error"], got
