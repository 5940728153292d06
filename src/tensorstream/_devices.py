"""Whether torch can allocate on a device, asked before a load reads anything."""

from __future__ import annotations

import torch

__all__ = ["unusable", "unusable_message"]

#: Checked by the loaders themselves (CUDA with messages of its own), or always usable.
_CHECKED = ("cpu", "meta", "cuda")


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
    return (f"device={str(given)!r} was requested but this torch cannot use it ({why}); "
            "use device='cpu', or 'cuda' on a machine with a GPU")
