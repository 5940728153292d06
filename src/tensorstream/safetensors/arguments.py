"""The arguments of the safetensors loaders, checked before anything is read:
``filter`` (:data:`Filter`), ``device``, ``num_readers`` and ``dtype``; and the
shards an index says hold a wanted tensor."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch

from .._devices import parse, shown, unusable, unusable_message
from ..config import validate_options
from ..errors import ConfigurationError, MalformedFileError
from .dtypes import _PACKED_TORCH
from .sources import Source, resolve_checkpoint

__all__ = ["Filter"]

Filter = Callable[[str], bool] | Collection[str] | None


def _wanted(filter: Filter) -> Callable[[str], bool]:
    if filter is None:
        return lambda name: True
    if callable(filter):
        return filter
    if isinstance(filter, (str, bytes)):
        # A string is a collection of its characters: filter="lm_head.weight" loaded nothing.
        raise ConfigurationError(f"filter={filter!r} is one string; pass a collection of "
                                 f"names (filter=[{filter!r}]) or a predicate on names")
    try:
        names = frozenset(filter)
    except TypeError:
        raise ConfigurationError(f"filter must be a predicate on tensor names or a collection "
                                 f"of names, got {type(filter).__name__}") from None
    return names.__contains__ if names else _nothing


def _nothing(name: str) -> bool:
    """The filter of an empty collection (``filter=[]``): asks for no tensor."""
    return False


def _sources(uri: Any, options: dict[str, Any],
             wanted: Callable[[str], bool] | None = None) -> list[Source]:
    """The files ``uri`` stands for (``wanted``: every tensor if None), an index naming no
    tensors refused unless ``wanted`` asks for none: load returned {} and iter_tensors/open
    held nothing, without a word."""
    ckpt = resolve_checkpoint(uri, options)
    if ckpt.index is not None and not ckpt.index.weight_map and wanted is not _nothing:
        raise MalformedFileError(
            f"{ckpt.index.where}: the index names no tensors (its weight_map is empty), so "
            "there is nothing to load; it is damaged or was written before its shards: write "
            "it again, or load the .safetensors files themselves")
    return ckpt.sources


def _device(device: str | torch.device | int | None) -> torch.device:
    dev = parse(device if device is not None else "cpu", ConfigurationError)
    if dev.type == "cuda":
        # Said before anything is read (torch would fail at the first pinned allocation).
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if torch.version.cuda is None
                   else "no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)")
            raise ConfigurationError(f"device={shown(device)} was requested but CUDA is not "
                                     f"available: {why}; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise ConfigurationError(f"device={shown(device)} was requested but only "
                                     f"{torch.cuda.device_count()} CUDA device(s) are visible")
    lacking = unusable(dev)
    if lacking is not None:  # said before the header is read, not at the first tensor
        raise ConfigurationError(unusable_message(device, lacking))
    return dev


def _needed(sources: list[Source], wanted: Callable[[str], bool]) -> list[Source]:
    """The shards an index says hold at least one wanted tensor (others are not opened)."""
    return [s for s in sources if s.names is None or any(wanted(n) for n in s.names)]


def _check(device: str | torch.device | int | None, num_readers: int | None,
           dtype: torch.dtype | None = None) -> tuple[torch.device, int]:
    """The device and reader count (0: the default), checked before anything is read."""
    dev = _device(device)
    # A string, a float or a bool was taken as is (num_readers="2": a bare TypeError later).
    readers: int | None = validate_options({"num_readers": num_readers})["num_readers"]
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point
                                  and dtype not in _PACKED_TORCH):
        # A dtype that is no torch.dtype failed after every byte was read (dtype="float16":
        # torch's "Invalid device string"); an integer or bool dtype turned every
        # floating-point weight into integers (transformers refuses one too).
        raise ConfigurationError(f"dtype={dtype!r} is not a floating-point torch.dtype; dtype "
                                 "casts the floating-point tensors (torch.float16, "
                                 "torch.bfloat16...), others keep theirs")
    return dev, readers or 0
