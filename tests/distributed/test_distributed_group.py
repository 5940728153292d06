"""resolve_group: what ``group=`` and ``group_timeout=`` accept, without starting ranks."""

from __future__ import annotations

import datetime

import pytest

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
