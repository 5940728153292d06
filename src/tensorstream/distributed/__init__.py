"""Read once per group: ranks of a ``torch.distributed`` group share one load.

``tensorstream.deserialize(uri, group="auto")`` (and ``load_into_module``,
``tensorstream.safetensors.load``/``iter_tensors``): each rank reads a
disjoint share of the object through the normal read engine, the shares are
broadcast over the group's own collectives (gloo on CPUs, NCCL on GPUs), and
every rank ends with the complete, verified tensors. Failure is collective:
every rank raises :class:`~tensorstream.errors.DistributedLoadError`. See
docs/distributed.md.

Imported lazily (torch is heavy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._compat import lazy_exports
from ..errors import DistributedLoadError

if TYPE_CHECKING:  # pragma: no cover
    from .exchange import DEFAULT_CHUNK
    from .group import Group, resolve_group

_WHERE = {
    "DEFAULT_CHUNK": "exchange",
    "Group": "group",
    "resolve_group": "group",
}

__all__ = ["DEFAULT_CHUNK", "DistributedLoadError", "Group", "resolve_group"]

__getattr__ = lazy_exports(__name__, _WHERE)
