"""A tiny model loader built on tensorstream's public API.

It reads a tensorizer file from any URI tensorstream understands (``s3://``,
``http(s)://``, ``redis://``, a local path) and returns its state dict.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from tensorizer import TensorDeserializer, TensorSerializer

import tensorstream


def load_state_dict(uri: str, *, device: str = "cpu", **options: Any) -> dict[str, torch.Tensor]:
    """Load every tensor of the tensorizer file at ``uri``; ``options`` go to tensorstream."""
    with tensorstream.open(uri, **options) as f:
        deserializer = TensorDeserializer(f, device=device)
        try:
            return {name: tensor.clone() for name, tensor in deserializer.items()}
        finally:
            deserializer.close()


def to_tensorizer_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """Serialize a state dict to tensorizer's format, in memory."""
    buf = _KeepOpen()
    serializer = TensorSerializer(buf)
    serializer.write_state_dict(state)
    serializer.close()  # closes ``buf`` too: keep its bytes
    return buf.data


class _KeepOpen(io.BytesIO):
    data = b""

    def close(self) -> None:
        if not self.closed:
            self.data = self.getvalue()
        super().close()
