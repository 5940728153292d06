"""Load tensorizer files from any backend onto a device, and serialize to any backend.

>>> import tensorstream
>>> with tensorstream.deserialize("s3://bucket/model.tensors", device="cuda") as sd:  # doctest: +SKIP
...     model.load_state_dict(sd)
>>> tensorstream.load_into_module(model, "https://host/model.tensors")  # doctest: +SKIP
>>> tensorstream.serialize(model, "redis://host:6379/model.tensors")  # doctest: +SKIP

Reads go through :func:`tensorstream.open`: each tensor's ``readinto`` fans
out into concurrent ranged requests straight into the tensor's memory, and
``num_readers > 1`` really runs in parallel (see ``_tensorizer_compat``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from tensorizer import TensorDeserializer

from ..distributed.exchange import agree
from ..errors import LoadError
from ..file import StreamReader
from ..uri import ParsedURI, redact
from .arguments import (
    DeviceUnavailableError,
    InvalidArgumentError,
    MetaTensorError,
    ModuleMismatchError,
    QuantizationWarning,
)
from .crypto import Encryption, generate_keyfile
from .deserializing import DEFAULT_LOCAL_NUM_READERS, DEFAULT_NUM_READERS, deserialize
from .foreign import DecryptionError, TensorHashMismatchError, translate
from .hook import (
    tensor_entries,
    tensor_names,
)
from .module import (
    ModuleLoadResult,
    assign_tensor,
    looks_quantized,
    mismatch_message,
    module_device,
    module_group,
)
from .save import serialize
from .sharding import (
    is_sharded,
    shard_uri,
)
from .stats import LoadStats

__all__ = [
    "DEFAULT_LOCAL_NUM_READERS",
    "DEFAULT_NUM_READERS",
    "DecryptionError",
    "DeviceUnavailableError",
    "Encryption",
    "InvalidArgumentError",
    "LoadError",
    "LoadStats",
    "MetaTensorError",
    "ModuleLoadResult",
    "ModuleMismatchError",
    "QuantizationWarning",
    "TensorHashMismatchError",
    "deserialize",
    "generate_keyfile",
    "is_sharded",
    "is_vllm_tensorized",
    "load_into_module",
    "serialize",
    "shard_uri",
]

#: vLLM registers this (meta) parameter on models it serializes.
VLLM_MARKER = "vllm_tensorized_marker"


def is_vllm_tensorized(deserializer: TensorDeserializer) -> bool:
    """True if the file was serialized by vLLM (it carries ``vllm_tensorized_marker``).

    Read from the metadata the deserializer already parsed; no second open.
    """
    return any(
        n == VLLM_MARKER or n.endswith("." + VLLM_MARKER) for n in tensor_names(deserializer)
    )


def load_into_module(
    module: torch.nn.Module,
    uri: str | os.PathLike[str] | ParsedURI | StreamReader,
    device: str | torch.device | int | None = None,
    *,
    strict: bool = True,
    **kwargs: Any,
) -> ModuleLoadResult:
    """Fill ``module``'s parameters and buffers in place from a tensorizer file.

    Works for files written from a module (``write_module``,
    ``serialize(model)``) and from a state dict (``write_state_dict``,
    ``serialize(model.state_dict())``); names are matched like
    ``nn.Module.load_state_dict`` does. Accepts the keyword arguments of
    :func:`deserialize`. ``device`` defaults to where the module's tensors
    already are (tensorizer's default for a module on ``meta``).

    ``strict=True`` (the default): the file and the module must hold the same
    tensors with the same shapes, else :class:`ModuleMismatchError` lists
    every missing, unexpected and shape-mismatched tensor and the module is
    left untouched. ``strict=False``: the tensors that fit are loaded and the
    rest is returned, like ``load_state_dict(strict=False)``. Returns a
    :class:`ModuleLoadResult` (``missing_keys``, ``unexpected_keys``,
    ``mismatched_keys``, ``loaded``, ``stats``). Warns
    (:class:`QuantizationWarning`) for quantized modules.

    >>> load_into_module(model, "s3://bucket/model.tensors", device="cuda:0")  # doctest: +SKIP
    """
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(
            f"load_into_module() fills an nn.Module, not {type(module).__name__}; for a "
            "mapping of tensors use tensorstream.deserialize()"
        )
    if looks_quantized(module):
        warnings.warn(
            "loading tensorizer weights into a module that looks quantized; tensorizer "
            "files hold the tensors as saved, so shapes and dtypes must match exactly",
            QuantizationWarning,
            stacklevel=2,
        )
    if device is None:
        device = module_device(module)
    where = redact(str(uri.name if isinstance(uri, StreamReader) else uri))
    # What the module holds: its state dict's names (params and persistent
    # buffers, tied weights under every name), and every tensor slot a file may fill.
    expected = {k: tuple(v.shape) for k, v in module.state_dict(keep_vars=True).items()}
    slots: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    slots.update(module.named_buffers(remove_duplicate=False))
    with deserialize(uri, device, **kwargs) as deserializer:
        # write_module names a top-level module's own tensors ".name" (one dot, dropped);
        # a state dict's names are its keys, kept as they are
        in_file = {name[1:] if kind != "state_dict" and name.startswith(".") else name:
                   (name, shape) for name, kind, shape in tensor_entries(deserializer)
                   if name in deserializer}
        missing = [k for k in expected if k not in in_file and not k.endswith(VLLM_MARKER)]
        unexpected = [k for k in in_file if k not in slots and not k.endswith(VLLM_MARKER)]
        mismatched = [(k, tuple(slots[k].shape), shape) for k, (_, shape) in in_file.items()
                      if k in slots and tuple(slots[k].shape) != shape]
        refused = None
        if strict and (missing or unexpected or mismatched):
            refused = ModuleMismatchError(
                mismatch_message(where, missing, unexpected, mismatched),
                missing_keys=missing, unexpected_keys=unexpected, mismatched_keys=mismatched,
            )
        shared = module_group(uri, kwargs)
        if shared is not None:
            # The group's load succeeded, but the modules may differ between ranks: one
            # rank refusing its module while the others go on would leave them waiting at
            # their next collective. Every rank raises, and no module is filled.
            agree(shared, f"loading {where} into the module", refused)
        elif refused is not None:
            raise refused
        bad = {k for k, _, _ in mismatched}
        loaded = 0
        try:
            for key, (name, _) in in_file.items():
                if key in slots and key not in bad:
                    assign_tensor(module, key, deserializer[name])
                    loaded += 1
        except BaseException as exc:
            mapped = translate(exc, where,
                               keyed=getattr(deserializer, "_encryption", None) is not None)
            if mapped is not None:
                raise mapped from exc
            raise
        stats = deserializer.stats
    left = [
        name
        for name, t in (*module.named_parameters(), *module.named_buffers())
        if t.device.type == "meta" and not name.endswith(VLLM_MARKER) and name not in missing
    ]
    if left:  # a file that holds them but did not fill them (should not happen)
        shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
        raise MetaTensorError(
            f"{len(left)} tensor(s) are still on the meta device after loading {where}: "
            f"{shown}. Check that the module matches the serialized model "
            "(architecture, quantization, filter_func)."
        )
    return ModuleLoadResult(loaded, missing, unexpected, mismatched, stats)
