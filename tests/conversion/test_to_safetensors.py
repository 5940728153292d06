"""tensorizer -> safetensors lays the tensors out as ``safetensors.torch.save_file`` does
(widest dtype first, then by name), whatever order the tensorizer file holds them in: the
converted file is byte for byte the one save_file writes of the same tensors."""

from __future__ import annotations

import io
import secrets
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import checkpoint

import tensorstream
from stores import Store

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


class _Kept(io.BytesIO):
    def close(self) -> None:  # TensorSerializer.close() closes its file; keep the bytes
        pass


def _tensorizer_bytes(tensors: dict[str, Any], key: bytes | None = None) -> bytes:
    """A tensorizer file written by tensorizer itself, in the dict's order."""
    buf = _Kept()
    encryption = tensorizer.EncryptionParams(key) if key else None
    serializer = tensorizer.TensorSerializer(buf, encryption=encryption)
    serializer.write_state_dict(tensors)
    serializer.close()
    return buf.getvalue()


def _misordered() -> dict[str, Any]:
    """Every dtype, odd element counts, in reverse name order: in file order an F64 tensor
    follows a 5-byte one (unaligned) and names run backwards."""
    want = checkpoint()
    want["odd.u8"] = torch.arange(5, dtype=torch.uint8)
    want["odd.f16"] = torch.arange(3, dtype=torch.float16)
    want["zz.f64"] = torch.arange(7, dtype=torch.float64)
    return {name: want[name] for name in sorted(want, reverse=True)}


def _aligned(blob: bytes) -> None:
    from tensorstream.safetensors.header import DTYPE_SIZES, header_from_prefix

    header = header_from_prefix(blob, len(blob), "converted", lambda o, n: blob[o:o + n])
    for t in header.tensors:  # each starts at a multiple of its element size
        assert (t.begin - header.data_start) % DTYPE_SIZES[t.dtype] == 0, t.name


def test_the_converted_file_is_the_one_save_file_writes(store: Store) -> None:
    want = _misordered()
    store.put("m.tensors", _tensorizer_bytes(want))
    tensorstream.convert(store.uri("m.tensors"), store.uri("m.safetensors"), **store.options)
    got = store.get("m.safetensors")
    assert got == st_torch.save(want, metadata={"format": "pt"})
    _aligned(got)


def test_batches_out_of_file_order_stay_byte_exact_and_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorstream.conversion import to_safetensors

    # 1 KiB tensors of two dtypes, interleaved in the file: every batch of the output order
    # gathers tensors from both ends of the tensorizer file
    want = {f"t{i:02d}": torch.full((256,), float(i),
                                    dtype=torch.float32 if i % 2 else torch.float16)
            for i in range(12)}
    key = secrets.token_bytes(32)
    (tmp_path / "m.tensors").write_bytes(_tensorizer_bytes(want, key))
    monkeypatch.setattr(to_safetensors, "BATCH_BYTES", 2048)
    loaded: list[list[str]] = []
    real = to_safetensors._load

    def spy(deserializer: Any, batch: list[Any], where: str) -> Any:
        loaded.append([p.name for p in batch])
        return real(deserializer, batch, where)

    monkeypatch.setattr(to_safetensors, "_load", spy)
    tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"),
                         encryption=key)
    assert (tmp_path / "m.safetensors").read_bytes() == st_torch.save(
        want, metadata={"format": "pt"})
    odd = [f"t{i:02d}" for i in range(1, 12, 2)]
    even = [f"t{i:02d}" for i in range(0, 12, 2)]
    assert [n for b in loaded for n in b] == odd + even  # F32 first, then F16, by name
    assert max(len(b) for b in loaded) <= 4  # 2 KiB a batch: never the whole model


def test_a_module_files_names_are_ordered_as_the_state_dict_names(tmp_path: Path) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    module.register_buffer("a_mask", torch.ones(3, dtype=torch.bool))
    buf = _Kept()
    serializer = tensorizer.TensorSerializer(buf)
    serializer.write_module(module)
    serializer.close()
    (tmp_path / "m.tensors").write_bytes(buf.getvalue())
    tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    want = {k: v.detach() for k, v in module.state_dict().items()}
    assert (tmp_path / "m.safetensors").read_bytes() == st_torch.save(
        want, metadata={"format": "pt"})
