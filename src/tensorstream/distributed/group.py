"""Which ``torch.distributed`` group a load is shared with (``group=``).

``group=None`` (the default) and a group of one leave the load exactly as it
is without a group. ``"auto"`` takes the default group when
``torch.distributed`` is initialised (and nothing otherwise), so the same
code runs under ``torchrun`` and in a single process.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from ..errors import ConfigurationError

__all__ = ["Group", "GroupArg", "collective_device", "resolve_group", "template_rank"]

#: What ``group=`` accepts.
GroupArg = Any  # a torch.distributed ProcessGroup, "auto" or None

log = logging.getLogger("tensorstream.distributed")
#: Whether the warning of group="auto" before init_process_group was logged (once a process).
_warned_unset = False

#: The longest ``group_timeout`` taken: ten years, far below what overflows.
_MAX_TIMEOUT_S = 10 * 365 * 24 * 3600


@dataclasses.dataclass(frozen=True)
class Group:
    """A resolved group of two or more ranks, and how its collectives are run."""

    pg: Any
    rank: int
    size: int
    backend: str
    #: Where collective buffers live: ``cpu`` for gloo; for NCCL the CUDA device the group is
    #: bound to (``init_process_group(device_id=)``), else the current one.
    device: torch.device
    #: Bounds every collective wait (``None``: the group's own timeout).
    timeout: datetime.timedelta | None

    @property
    def in_place(self) -> bool:
        """Host memory can be broadcast in place (gloo): no staging copy."""
        return self.device.type == "cpu"

    def global_rank(self, rank: int) -> int:
        """The default group's rank of this group's ``rank`` (what ``src=`` takes)."""
        if self.pg is None or self.pg == dist.group.WORLD:
            return rank
        return int(dist.get_global_rank(self.pg, rank))


def _timeout(value: float | datetime.timedelta | None) -> datetime.timedelta | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(f"group_timeout={value!r} is not a number of seconds")
    if not seconds > 0:
        raise ConfigurationError(f"group_timeout must be > 0 seconds, got {value!r}")
    # torch waits take whole milliseconds, and 0 ms means no limit at all: a timeout
    # under 1 ms would wait forever for a dead rank
    if seconds < 0.001:
        raise ConfigurationError(
            f"group_timeout={value!r} is under a millisecond: torch waits in whole "
            "milliseconds and takes 0 as no limit; pass at least 0.001 seconds")
    # torch waits take whole milliseconds in a C++ int64; timedelta stops at 10**9 days
    if not seconds <= _MAX_TIMEOUT_S:
        raise ConfigurationError(
            f"group_timeout={value!r} is too large (at most {_MAX_TIMEOUT_S} seconds); leave "
            "it out (None) to wait as long as the group's own timeout")
    return datetime.timedelta(seconds=seconds)


def _non_member(group: object) -> bool:
    marker = getattr(getattr(dist, "GroupMember", None), "NON_GROUP_MEMBER", None)
    return marker is not None and type(group) is type(marker) and group == marker


def _process_group(group: GroupArg) -> Any:
    """The process group ``group=`` names (checked), or ``None`` for none."""
    if group is None:
        return None
    available = dist.is_available() and dist.is_initialized()
    if isinstance(group, str):
        if group != "auto":
            raise ConfigurationError(
                f"group={group!r}: pass a torch.distributed process group, 'auto' or None")
        if not available:
            _warn_launched()
            return None  # no distributed run: a load of its own
        return dist.group.WORLD
    if _non_member(group):
        # what dist.new_group(ranks) returns in a process that is not in ``ranks``
        raise ConfigurationError(
            "group= is GroupMember.NON_GROUP_MEMBER: this process is not a member of the "
            "group (dist.new_group returns it to the ranks it leaves out); pass group=None "
            "for a load of its own, or a group this process is in")
    if isinstance(group, dist.ProcessGroup):
        if not available:
            raise ConfigurationError("group= was given but torch.distributed is not initialised")
        if dist.get_rank(group) < 0:
            raise ConfigurationError("this process is not a member of the group passed as group=")
        return group
    raise ConfigurationError(
        f"group= takes a torch.distributed ProcessGroup, 'auto' or None, "
        f"not {type(group).__name__}")


def _warn_launched() -> None:
    """Say (once) that group="auto" shares nothing under a launcher before
    ``init_process_group``: every process then pulls the whole file."""
    global _warned_unset
    size = os.environ.get("WORLD_SIZE", "").strip()
    if _warned_unset or not size.isdigit() or int(size) <= 1:
        return
    _warned_unset = True
    log.warning(
        "group='auto' but torch.distributed is not initialised while a launcher started "
        "%s processes (WORLD_SIZE=%s): each process reads the whole file on its own; call "
        "torch.distributed.init_process_group() before loading to read it once per group",
        size[:20], size[:20])


def template_rank(group: GroupArg, rank: int | None,
                  world_size: int | None) -> tuple[int | None, int | None]:
    """The ``(rank, world_size)`` that fill a rank template loaded with ``group=``.

    A process group passed as ``group=`` (a tensor-parallel group of a serving
    engine) names the shard: this process's rank in it and its size, as vLLM
    fills ``model-rank-%03d.tensors`` with the tensor-parallel rank, not the
    global one. ``rank``/``world_size`` that contradict it are refused. With
    ``"auto"`` or ``None`` they are returned as given (the global rank fills
    the template when they are ``None``).
    """
    if group is None or isinstance(group, str):
        return rank, world_size
    pg = _process_group(group)
    mine, size = int(dist.get_rank(pg)), int(dist.get_world_size(pg))
    for name, given, own in (("rank", rank, mine), ("world_size", world_size, size)):
        if given is not None and given != own:
            raise ConfigurationError(
                f"{name}={given!r} contradicts group=: this process is rank {mine} of {size} "
                "in the group passed, and that rank fills the rank template (as vLLM fills "
                "it with the tensor-parallel rank); leave rank= and world_size= out, or "
                "pass group=None to fill it with them")
    return mine, size


def resolve_group(group: GroupArg, timeout: float | datetime.timedelta | None = None) -> Group | None:
    """The group a load is shared with, or ``None`` for a load of its own.

    ``group``: a ``torch.distributed`` process group, ``"auto"`` (the default
    group when one is initialised) or ``None``. A group of one is ``None``.
    ``timeout`` (seconds) bounds each collective wait; default: the group's.
    """
    limit = _timeout(timeout)
    pg = _process_group(group)
    if pg is None:
        return None
    rank = dist.get_rank(pg)
    size = dist.get_world_size(pg)
    if size == 1:
        return None
    backend = str(dist.get_backend(pg)).lower()
    if "gloo" in backend or "nccl" not in backend:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise ConfigurationError(f"group backend {backend} needs CUDA, which is not available")
        device = collective_device(pg)
    return Group(pg, rank, size, backend, device, limit)


def collective_device(pg: Any) -> torch.device:
    """The CUDA device an NCCL group's collectives run on for this rank, as torch's
    own ``barrier`` picks it: the device the group is bound to
    (``init_process_group(device_id=...)``, inherited by ``new_group``), else the
    current device (``torch.cuda.set_device``). A rank that bound its group to
    ``cuda:1`` without ``set_device`` staged on ``cuda:0``, as every other rank of
    the node did (NCCL then fails or hangs on a GPU shared by two ranks)."""
    for owner in (pg, dist.group.WORLD if dist.is_initialized() else None):
        bound = getattr(owner, "bound_device_id", None)
        if bound is not None and bound.type == "cuda":
            return torch.device("cuda", bound.index)
    return torch.device("cuda", torch.cuda.current_device())
