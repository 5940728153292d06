"""torch's devices as the loader tests need them (tests/safetensors, tests/tensorizer): the
default device a model is built under, and the device types this torch names but cannot use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: How a model's default device is set: ``with torch.device("meta"):`` or
#: ``torch.set_default_device("meta")`` (see :func:`default_device`).
DEFAULTS = ["with-meta", "set-default-meta"]


@contextlib.contextmanager
def default_device(how: str) -> Iterator[None]:
    """Run the block with torch's default device ``meta``, set ``how`` (one of
    :data:`DEFAULTS`); ``set_default_device`` is put back to none after it."""
    if how == "with-meta":
        with torch.device("meta"):
            yield
        return
    assert how == "set-default-meta", how
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def unusable_devices() -> list[str]:
    """Device types torch names but cannot allocate on here (no MPS/XLA/XPU build)."""
    out = []
    for name in ("mps", "xla", "xpu"):
        try:
            torch.empty(0, device=name)
        except Exception:
            out.append(name)
    return out
