"""Run a function on N ranks of a gloo (or NCCL) group, for tests of ``group=`` loads.

:func:`run_ranks` starts ``world_size`` processes with
``torch.multiprocessing.spawn`` (``join=False``), each joining one gloo group
over ``tcp://127.0.0.1:<free port>`` before calling ``fn(rank, world_size,
*args)``. What each rank returned, or the error it raised, comes back through
a file per rank, so a rank that dies or hangs is reported (``exitcode``,
``hung``) instead of hanging the test. ``fn`` must be importable by name (a
module-level function).

>>> results = run_ranks(my_scenario, 2, "http://127.0.0.1:8000/m.tensors")  # doctest: +SKIP
>>> [r.value for r in results]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["RankResult", "run_ranks"]


@dataclasses.dataclass
class RankResult:
    """What one rank did: ``value`` (``fn``'s result) or an error.

    ``error_types`` lists the raised exception's classes (its MRO names),
    ``error`` its message, ``attributes`` its ``failed_ranks``/``errors``;
    ``seconds`` how long ``fn`` ran; ``exitcode`` the process's exit status
    (``None`` when it was still running at the deadline: ``hung``).
    """

    rank: int
    value: Any = None
    error_types: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    exitcode: int | None = None
    hung: bool = False
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.hung and self.exitcode == 0

    def raised(self, name: str) -> bool:
        """True if the rank raised an exception that is (a subclass of) ``name``."""
        return name in self.error_types


def _entry(rank: int, fn: Callable[..., Any], world_size: int, folder: str,
           timeout: float, backend: str, args: tuple[Any, ...]) -> None:  # pragma: no cover
    import torch.distributed as dist

    if backend == "nccl":
        import torch

        torch.cuda.set_device(rank)  # one GPU per rank
    # The ranks meet through a file of the run's own folder, not a TCP port picked
    # free before rank 0 bound it (another process could take it in between).
    store = os.path.join(folder, "rendezvous")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    out = RankResult(rank)
    started = time.monotonic()
    try:
        out.value = fn(rank, world_size, *args)
    except BaseException as exc:
        out.error_types = [c.__name__ for c in type(exc).__mro__]
        out.error = str(exc)
        out.traceback = traceback.format_exc()
        out.attributes = {k: getattr(exc, k) for k in ("failed_ranks", "errors")
                          if hasattr(exc, k)}
    out.seconds = time.monotonic() - started
    path = os.path.join(folder, f"rank-{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(out, f)
    os.replace(path + ".tmp", path)
    # No destroy_process_group(): it may wait for peers that died; the process ends here.
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0,
              group_timeout: float = 30.0, backend: str = "gloo") -> list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks of a
    ``backend`` group (gloo; ``"nccl"``: rank N on ``cuda:N``; ``group_timeout``:
    the group's collective timeout) and return each rank's :class:`RankResult`.
    Ranks still running after ``timeout`` seconds are killed and reported as
    ``hung``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tensorstream-ranks-") as folder:
        ctx = mp.spawn(_entry, args=(fn, world_size, folder, group_timeout, backend, args),
                       nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout
        for proc in ctx.processes:
            proc.join(max(0.0, deadline - time.monotonic()))
        results = []
        for rank, proc in enumerate(ctx.processes):
            hung = proc.is_alive()
            if hung:
                proc.kill()
                proc.join(10)
            path = os.path.join(folder, f"rank-{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    result: RankResult = pickle.load(f)
            else:
                result = RankResult(rank, error="the rank left no result (it died or hung)")
            result.exitcode = None if hung else proc.exitcode
            result.hung = hung
            results.append(result)
        return results
