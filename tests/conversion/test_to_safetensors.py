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


def test_tensorizer_reads_only_runs_of_neighbours_and_no_further(
        http_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read asks tensorizer for tensors that follow each other in its file, and the
    read-ahead stops at the last of them: one read of a batch scattered over the file made
    tensorizer read every tensor header between its first and last tensor (each after a
    seek: a request of its own) and the read-ahead run on past it; a 144 MiB file, in module
    order, sent 310 MiB over loopback (160 MiB so)."""
    from tensorstream.conversion import to_safetensors
    from tensorstream.file import StreamReader
    from tensorstream.tensorizer.hook import StreamTensorDeserializer, index_entries

    # layers.0, layers.1, ..., layers.11 in the file; layers.0, layers.1, layers.10, ... by name
    want = {f"layers.{i}.{n}": torch.full((256,), float(i), dtype=dtype)
            for i in range(12) for n, dtype in (("w", torch.float16), ("norm", torch.float32))}
    blob = _tensorizer_bytes(want)
    http_server.put("scattered.tensors", blob)
    monkeypatch.setattr(to_safetensors, "BATCH_BYTES", 2048)
    asked: list[list[int]] = []
    real_read = StreamTensorDeserializer.read_tensors

    def read_tensors(self: Any, *args: Any, filter_func: Any = None, **kw: Any) -> Any:
        order = [e.key for e in index_entries(self)]
        asked.append([i for i, key in enumerate(order) if filter_func(key)])
        return real_read(self, *args, filter_func=filter_func, **kw)

    ends: list[int | None] = []
    real_end = StreamReader.set_readahead_end

    def set_readahead_end(self: Any, end: int | None) -> None:
        ends.append(end)
        real_end(self, end)

    monkeypatch.setattr(StreamTensorDeserializer, "read_tensors", read_tensors)
    monkeypatch.setattr(StreamReader, "set_readahead_end", set_readahead_end)
    result = tensorstream.convert(http_server.url("scattered.tensors"),
                                  str(tmp_path / "scattered.safetensors"),
                                  **http_server.options)
    assert result.tensors == len(want)
    assert (tmp_path / "scattered.safetensors").read_bytes() == st_torch.save(
        want, metadata={"format": "pt"})
    assert len(asked) > 2
    for positions in asked:  # neighbours in the file, never a tensor skipped between
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert None not in ends[ends.index(None) + 1:]  # (the open's own None before the reads)
