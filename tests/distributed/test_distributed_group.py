"""What ``group=`` and ``group_timeout=`` accept (resolve_group, and deserialize
around it), without starting ranks."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from tensorstream.distributed.group import resolve_group
from tensorstream.errors import ConfigurationError

dist = pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, 10**30, datetime.timedelta.max])
def test_a_timeout_too_large_for_torch_is_a_configuration_error(timeout: object) -> None:
    with pytest.raises(ConfigurationError, match=r"group_timeout=.* too large"):
        resolve_group(None, timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0.0005, 1e-9, datetime.timedelta(microseconds=999)])
def test_a_timeout_under_a_millisecond_is_refused(timeout: object) -> None:
    # torch rounded it to 0 ms, which it takes as no limit: a dead rank was waited for forever
    with pytest.raises(ConfigurationError, match="under a millisecond"):
        resolve_group(None, timeout)  # type: ignore[arg-type]


def test_a_long_timeout_is_kept() -> None:
    # group=None: the timeout is still checked, nothing else happens
    assert resolve_group(None, 365 * 24 * 3600.0) is None


def test_a_subgroup_this_process_is_not_in_says_so() -> None:
    # dist.new_group(ranks) hands GroupMember.NON_GROUP_MEMBER to the ranks it leaves out
    with pytest.raises(ConfigurationError, match="not a member of the group"):
        resolve_group(dist.GroupMember.NON_GROUP_MEMBER)


@pytest.mark.parametrize("kwargs", [{"group": "autp"}, {"group": 5},
                                    {"group": "auto", "group_timeout": -1}])
def test_group_arguments_are_checked_with_a_rank_template_too(tmp_path: Path,
                                                              kwargs: dict[str, Any]) -> None:
    # a template names each rank's own file (the group is not used), but a misspelt group=,
    # or a negative group_timeout, passed without a word and the rank's file was read
    with pytest.raises(ConfigurationError, match="group"):
        tensorstream.deserialize(str(tmp_path / "m-%03d.tensors"), device="cpu", rank=0,
                                 world_size=2, **kwargs)


@pytest.mark.parametrize(("rank", "world_size"), [(3, 2), (-1, 2), (True, 2), (0, 0)])
def test_rank_and_world_size_are_checked_with_group_too(tmp_path: Path, rank: Any,
                                                        world_size: Any) -> None:
    # with group= an untemplated URI is one file for the group: rank/world_size are not
    # used, but rank=3 of world_size=2 passed without a word
    with pytest.raises(ConfigurationError, match="rank"):
        tensorstream.deserialize(str(tmp_path / "m.tensors"), device="cpu", group="auto",
                                 rank=rank, world_size=world_size)


def test_auto_under_a_launcher_before_init_says_each_process_reads_the_whole_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        ) -> None:
    # torchrun started 4 processes and the load ran before init_process_group: group="auto"
    # quietly became a load of its own in each, and storage served 4 copies
    import torch

    from tensor_files import tensorizer_bytes

    assert not dist.is_initialized()
    path = tmp_path / "m.tensors"
    path.write_bytes(tensorizer_bytes({"w": torch.ones(3)}, tmp_path))
    monkeypatch.setattr("tensorstream.distributed.group._warned_unset", False)  # once a process
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level("WARNING", logger="tensorstream.distributed"), \
            tensorstream.deserialize(str(path), device="cpu", group="auto") as sd:
        assert sd["w"].tolist() == [1.0, 1.0, 1.0]
    said = [r.getMessage() for r in caplog.records if r.name == "tensorstream.distributed"]
    assert len(said) == 1 and "WORLD_SIZE=4" in said[0], said
    assert "init_process_group" in said[0] and "whole file" in said[0], said
    caplog.clear()
    monkeypatch.setattr("tensorstream.distributed.group._warned_unset", False)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing to say
    with caplog.at_level("WARNING", logger="tensorstream.distributed"), \
            tensorstream.deserialize(str(path), device="cpu", group="auto"):
        pass
    assert not [r for r in caplog.records if r.name == "tensorstream.distributed"]


@pytest.mark.timeout(120)
def test_an_nccl_group_bound_to_a_device_stages_on_that_device() -> None:
    """Ranks that bind their group with init_process_group(device_id=cuda:N) and never
    call torch.cuda.set_device had every staging buffer on the current device, cuda:0,
    on every rank of the node (NCCL fails or hangs on a GPU two ranks share). The bound
    device is taken now, as torch's own barrier takes it; a subgroup inherits it."""
    from dist_scenarios import bound_devices

    from tensorstream.testing.distributed import run_ranks

    results = run_ranks(bound_devices, 2, timeout=90)
    assert all(r.ok for r in results), [(r.rank, r.error) for r in results]
    assert [r.value for r in results] == [["cuda:1", "cuda:1", "cuda:5"],
                                          ["cuda:2", "cuda:2", "cuda:5"]]
