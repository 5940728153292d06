"""What each spawned rank does in tests/distributed (run by
:func:`tensorstream.testing.distributed.run_ranks`; importable by name in the child)."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import torch


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (dtype and shape included)."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + data).hexdigest()


def only_layer1(name: str) -> bool:
    """A filter_func (importable by name in the ranks)."""
    return name.startswith("layer1")


#: filter_funcs a step names (``kwargs={"filter_func": name}``): functions do not
#: travel to the spawned ranks.
FILTERS = {
    "only_layer1": only_layer1,
    "keep_none": lambda name: False,
    "keep_all": lambda name: True,
    "not_big": lambda name: name != "big",
    "only_big": lambda name: name == "big",
}


def _group(kind: Any, groups: dict[str, Any]) -> Any:
    return groups.get(kind, kind) if isinstance(kind, str) else kind


def _run(step: dict[str, Any], rank: int, groups: dict[str, Any]) -> dict[str, Any]:
    import tensorstream

    uri = step["uri"][rank] if isinstance(step["uri"], list) else step["uri"]
    kwargs = dict(step["kwargs"][rank] if isinstance(step.get("kwargs"), list)
                  else step.get("kwargs", {}))
    if isinstance(kwargs.get("filter_func"), str):
        kwargs["filter_func"] = FILTERS[kwargs["filter_func"]]
    kwargs.update(step.get("options", {}))
    group = _group(step.get("group", "auto"), groups)
    kind = step.get("kind", "deserialize")
    device = step.get("device", "cpu").replace("{rank}", str(rank))
    if kind == "deserialize":
        with tensorstream.deserialize(uri, device=device, group=group, **kwargs) as sd:
            tensors = {k: sd[k] for k in sd}
            stats = sd.stats.as_dict()
        return {"digests": {k: digest(v) for k, v in tensors.items()}, "stats": stats}
    if kind == "config":  # vLLM-style: TensorizerConfig(...).deserialize(group=)
        from tensorstream.tensorizer import TensorizerConfig

        config = TensorizerConfig(tensorizer_uri=uri)
        with config.deserialize(device, group=group, **kwargs) as sd:
            return {"digests": {k: digest(sd[k]) for k in sd}, "stats": sd.stats.as_dict()}
    if kind == "module":
        module = torch.nn.Module()
        shapes = step["shapes"][rank] if isinstance(step["shapes"], list) else step["shapes"]
        for name, shape in shapes.items():
            owner = module
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
        result = tensorstream.load_into_module(module, uri, "cpu", group=group, **kwargs)
        return {"digests": {k: digest(v) for k, v in module.state_dict().items()},
                "loaded": result.loaded}
    if kind == "safetensors":
        sd = tensorstream.safetensors.load(uri, device, group=group, **kwargs)
        assert all(t.device.type == torch.device(device).type for t in sd.values())
        return {"digests": {k: digest(v) for k, v in sd.items()}}
    if kind == "iter":
        got = dict(tensorstream.safetensors.iter_tensors(uri, group=group, **kwargs))
        return {"digests": {k: digest(v) for k, v in got.items()}}
    raise ValueError(kind)


def steps(rank: int, world: int, todo: list[dict[str, Any]]) -> dict[str, Any]:
    """Run each step; record its result or the error it raised (and when)."""
    import torch.distributed as dist

    # every rank creates every group, in the same order
    solos = [dist.new_group([r]) for r in range(world)]
    # "pair": tensor-parallel groups of two ([0, 1], [2, 3], ...), as vLLM's TP groups
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)]
    groups = {"solo": solos[rank]}
    if rank // 2 < len(pairs):
        groups["pair"] = pairs[rank // 2]
    import logging

    class Warnings(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.said: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.said.append(record.getMessage())

    out: dict[str, Any] = {}
    for step in todo:
        started = time.monotonic()
        warnings = Warnings()
        logging.getLogger("tensorstream").addHandler(warnings)
        try:
            out[step["label"]] = _run(step, rank, groups)
        except Exception as exc:
            out[step["label"]] = {"error": f"{type(exc).__name__}: {exc}",
                                  "types": [c.__name__ for c in type(exc).__mro__],
                                  "failed_ranks": getattr(exc, "failed_ranks", None)}
        finally:
            logging.getLogger("tensorstream").removeHandler(warnings)
        out[step["label"]]["seconds"] = time.monotonic() - started
        out[step["label"]]["warnings"] = warnings.said
    return out


def break_rank(rank: int, world: int, step: dict[str, Any], victim: int, how: str) -> Any:
    """Rank ``victim`` exits (``how="exit"``) or stops answering (``"hang"``)
    while reading its share (``"exit-own"``/``"hang-own"``: while opening its own
    file, a rank template's); the other ranks run ``step``."""
    import importlib

    if rank == victim:
        def broken(*args: Any, **kwargs: Any) -> None:
            if how == "exit":
                os._exit(0)
            time.sleep(10)  # far past the others' group_timeout
            os._exit(0)

        for name in ("tensorstream.distributed.tensorizer", "tensorstream.safetensors.group_load"):
            module = importlib.import_module(name)
            if how == "exit-in-exchange":  # dies once the exchange has begun
                real = module.broadcast_shares

                def dying(group: Any, shares: Any, what: str, *args: Any, real: Any = real,
                          **kw: Any) -> None:
                    first = [list(s[:1]) for s in shares[:1]]
                    real(group, first, what)  # one broadcast: the peers' exchange has started
                    os._exit(0)

                module.broadcast_shares = dying
            else:
                module.read_share = broken
        if how in ("exit-own", "hang-own"):  # while opening its own file (a rank template)
            load = importlib.import_module("tensorstream.tensorizer.deserializing")
            load.open_local = broken  # type: ignore[attr-defined]
            how = how.split("-")[0]
    return _run(step, rank, {})


def bound_devices(rank: int, world: int) -> list[str]:
    """The collective device of a group bound to a CUDA device as
    ``init_process_group(device_id=...)`` binds it (set here, as torch sets it: a gloo
    rank has no GPU to bind), and of a subgroup of it."""
    import torch.distributed as dist

    from tensorstream.distributed.group import collective_device

    sub = dist.new_group(list(range(world)))
    dist.group.WORLD.bound_device_id = torch.device("cuda", 1 + rank)
    got = [str(collective_device(dist.group.WORLD)), str(collective_device(sub))]
    sub.bound_device_id = torch.device("cuda", 5)
    return [*got, str(collective_device(sub))]


def _status(field: str) -> int:
    """``field`` of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_rss(rank: int, world: int, uri: str, group: Any) -> dict[str, int]:
    """Load ``uri`` with ``group=`` and measure this rank's resident memory: before
    the load (the peak reset there, through /proc/self/clear_refs), its peak
    during the load, and the bytes of the tensors loaded."""
    import tensorstream

    with tensorstream.deserialize(uri, device="cpu", group=group) as warm:  # imports, pools
        del warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status("VmRSS")
    with tensorstream.deserialize(uri, device="cpu", group=group) as sd:
        held = sum(t.numel() * t.element_size() for t in sd.values())
    return {"before": before, "peak": _status("VmHWM"), "held": held}
