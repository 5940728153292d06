"""What :func:`~tensorstream.tensorizer.load.load_into_module` needs besides the load:
its result, the module's state and the message of a mismatch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..distributed.group import Group, resolve_group
from ..file import StreamReader
from .stats import LoadStats

__all__ = ["ModuleLoadResult", "assign_tensor", "looks_quantized", "mismatch_message",
           "module_device", "module_group"]


@dataclasses.dataclass
class ModuleLoadResult:
    """What :func:`load_into_module` did, like ``nn.Module.load_state_dict``'s result.

    ``missing_keys``/``unexpected_keys`` as in torch; ``mismatched_keys``
    holds ``(name, module_shape, file_shape)`` of tensors left alone because
    their shapes differ (all three are empty after a ``strict=True`` load).
    ``loaded`` counts the tensors put into the module; ``stats`` is the
    load's :class:`LoadStats`.
    """

    loaded: int
    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    stats: LoadStats | None = None


def looks_quantized(module: torch.nn.Module) -> bool:
    if getattr(module, "quant_config", None) or getattr(module, "quantization_config", None):
        return True
    if any("quant" in type(m).__name__.lower() for m in module.modules()):
        return True
    low_bit = {torch.int8, torch.uint8, torch.qint8, torch.quint8, torch.qint32}
    low_bit |= {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
    return any(p.dtype in low_bit for p in module.parameters())


def module_device(module: torch.nn.Module) -> torch.device | None:
    for t in (*module.parameters(), *module.buffers()):
        if t.device.type != "meta":
            return t.device
    return None


def module_group(uri: Any, kwargs: Mapping[str, Any]) -> Group | None:
    """The group :func:`deserialize` shares this load with (``group=``), or None."""
    if isinstance(uri, StreamReader) or kwargs.get("group") is None:
        return None
    # a rank template too: a rank whose module differs raised alone, its peers went on
    return resolve_group(kwargs["group"], kwargs.get("group_timeout"))


def mismatch_message(
    where: str, missing: list[str], unexpected: list[str],
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
) -> str:
    def shown(items: list[str]) -> str:
        return ", ".join(items[:20]) + (f" and {len(items) - 20} more" if len(items) > 20 else "")

    parts = []
    if missing:
        parts.append(f"missing from the file ({len(missing)}): {shown(missing)}")
    if unexpected:
        parts.append(f"not in the module ({len(unexpected)}): {shown(unexpected)}")
    if mismatched:
        parts.append(f"shape mismatch ({len(mismatched)}): " + shown(
            [f"{k} module {list(a)} file {list(b)}" for k, a, b in mismatched]))
    return (
        f"{where} does not match the module: {'; '.join(parts)}. Check that the module "
        "matches the serialized model (architecture, config, quantization, filter_func), "
        "or pass strict=False to load the tensors that fit and get the rest back."
    )


def assign_tensor(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Put ``tensor`` in place of the parameter or buffer ``name`` (replacing it,
    as tensorizer does, so a module on ``meta`` gets real storage)."""
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if attr in owner._parameters:
        old = owner._parameters[attr]
        requires_grad = bool(old.requires_grad) if old is not None else False
        data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        owner._parameters[attr] = torch.nn.Parameter(data, requires_grad=requires_grad)
    else:
        owner._buffers[attr] = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
