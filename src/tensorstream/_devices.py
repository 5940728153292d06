"""Whether torch can allocate on a device, asked before a load reads anything."""

from __future__ import annotations

import numbers

import torch

__all__ = ["parse", "shown", "unusable", "unusable_message"]

#: Checked by the loaders themselves (CUDA with messages of its own), or always usable.
_CHECKED = ("cpu", "meta", "cuda")


_KINDS = "use 'cpu', 'cuda', 'cuda:N' or an index N (cuda:N)"


def parse(device: object, error: type[Exception]) -> torch.device:
    """``device`` as ``torch.device()`` takes it (a name, a ``torch.device``, an index),
    or ``error`` saying what was wrong.

    An index is the accelerator's device, as torch and tensorizer take it: ``0`` is
    ``cuda:0`` on a CUDA machine. Without an accelerator, torch's "Cannot access
    accelerator device" made ``device=0`` "not a torch device"; it is ``cuda:N`` here, so
    the caller's CUDA check says what is missing, as for ``'cuda'``. A numpy integer
    (``np.int64(0)``, what an index read from an array is) is an index, as torch takes
    it; a numpy bool is a bool."""
    if isinstance(device, bool) or _numpy_bool(device):
        # An int to Python (np.True_ is no int, but as much a bool); torch refuses both,
        # and True is no index.
        raise error(f"device={bool(device)!r} is a bool, not a device; {_KINDS}")
    if isinstance(device, numbers.Integral):
        device = int(device)  # np.int64(0): the same index, and messages say 0
        if device < 0:
            raise error(f"device={device!r} is not a device index (an index is 0 or "
                        f"more); {_KINDS}")
        accelerator = getattr(torch, "accelerator", None)  # (torch 2.6 on; before, N was cuda:N)
        if accelerator is None or not accelerator.is_available():
            return torch.device("cuda", device)
    try:
        return torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError) as exc:  # torch's bare error names no option
        raise error(f"device={device!r} is not a torch device; {_KINDS}") from exc


def _numpy_bool(device: object) -> bool:
    """Whether ``device`` is numpy's bool (``np.True_``; ``bool`` in numpy 2, ``bool_``
    before), told by its type's name so numpy is not imported for it."""
    kind = type(device)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def shown(device: object) -> str:
    """``device`` as a message quotes it: ``'cuda:1'`` for a name or a ``torch.device``,
    ``0`` for an index (not ``'0'``, which is no device name; ``np.int64(0)`` too)."""
    if isinstance(device, numbers.Integral) and not isinstance(device, bool):
        return repr(int(device))
    return repr(str(device))


def unusable(device: torch.device) -> str | None:
    """Why torch cannot allocate on ``device``, or ``None`` where it can.

    A device type torch names but this build or machine lacks (``mps`` off macOS,
    ``xla`` without torch_xla, ``xpu`` without an XPU build) failed only at the first
    tensor, with torch's bare error, after the file's header had been read. One empty
    allocation says it first, whatever the backend (torch raises ``RuntimeError``,
    ``NotImplementedError`` or ``AssertionError`` for these)."""
    if device.type in _CHECKED:
        return None
    try:
        torch.empty(0, device=device)
    except Exception as exc:  # whatever the backend raises: said, not chained
        text = str(exc).strip()
        first = text.splitlines()[0][:160] if text else ""
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return None


def unusable_message(given: object, why: str) -> str:
    """The message for a device :func:`unusable` refused (``given``: as the caller gave it)."""
    return (f"device={shown(given)} was requested but this torch cannot use it ({why}); "
            "use device='cpu', or 'cuda' on a machine with a GPU")
