"""tensorstream.inspect: tensors and metadata of safetensors files, sharded checkpoints and
tensorizer files (encrypted too) from their headers only -- checked against a server that
counts the bytes it sends -- with the format taken from the bytes, and hostile files refused
with an error naming them."""

from __future__ import annotations

import functools
import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.errors import MalformedFileError, NotFoundError
from tensorstream.inspection import FIRST_READ, ModelInfo
from tensorstream.testing.http_server import HTTPTestServer

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")

MiB = 1 << 20


def _st_bytes(tensors: dict[str, Any], tmp_path: Path, metadata: dict[str, str] | None = None,
              name: str = "m.safetensors") -> bytes:
    path = tmp_path / name
    st_torch.save_file(tensors, str(path), metadata=metadata)
    return path.read_bytes()


def _tz_bytes(tensors: dict[str, Any], encryption: Any = None) -> bytes:
    buf = io.BytesIO()
    buf.close = lambda: None  # type: ignore[method-assign]  # keep the bytes after close()
    s = tensorizer.TensorSerializer(buf, encryption=encryption)
    s.write_state_dict(tensors)
    s.close()
    return buf.getvalue()


def _big() -> dict[str, Any]:
    g = torch.Generator().manual_seed(5)
    return {"embed": torch.randn(2048, 1024, generator=g).to(torch.bfloat16),  # 4 MiB
            "lm_head": torch.randn(1024, 1024, generator=g),  # 4 MiB
            "norm": torch.ones(1024, dtype=torch.float16),
            "step": torch.tensor(3, dtype=torch.int64)}


def test_safetensors_file_from_its_header_only(http_server: HTTPTestServer, http_reset: None,
                                               tmp_path: Path) -> None:
    tensors = _big()
    blob = _st_bytes(tensors, tmp_path, {"format": "pt"})
    http_server.put("insp/model.safetensors", blob)
    http_server.clear_log()
    info = tensorstream.inspect(http_server.url("insp/model.safetensors"))
    sent = http_server.bytes_sent("insp/model.safetensors")
    assert 0 < sent <= FIRST_READ and sent == info.bytes_read, sent  # not the 8 MiB of tensors
    assert info.format == "safetensors" and info.metadata == {"format": "pt"}
    assert info.size == len(blob) and len(info.files) == 1
    by_name = {t.name: t for t in info.tensors}
    assert sorted(by_name) == sorted(tensors)
    assert by_name["embed"].dtype == "BF16" and by_name["embed"].shape == (2048, 1024)
    assert by_name["step"].shape == () and by_name["step"].nbytes == 8
    for name, t in tensors.items():
        meta = by_name[name]
        assert meta.nbytes == t.numel() * t.element_size()
        # the offset is where the tensor's bytes are
        assert blob[meta.offset:meta.offset + meta.nbytes] == t.reshape(-1).view(
            torch.uint8).numpy().tobytes()
    assert info.total_bytes == sum(t.nbytes for t in info.tensors)
    assert info.dtypes() == {"F32": (1, 4 * MiB), "BF16": (1, 4 * MiB), "F16": (1, 2048),
                             "I64": (1, 8)}
    assert json.loads(json.dumps(info.to_dict()))["totals"]["tensors"] == 4


def test_large_header_takes_one_more_bounded_read(http_server: HTTPTestServer, http_reset: None,
                                                  tmp_path: Path) -> None:
    tensors = {f"model.layers.{i}.self_attn.q_proj.weight": torch.full((4,), float(i))
               for i in range(3000)}  # a header of ~200 KiB
    blob = _st_bytes(tensors, tmp_path)
    header_len = struct.unpack("<Q", blob[:8])[0]
    assert header_len > FIRST_READ
    http_server.put("insp/many.safetensors", blob)
    http_server.clear_log()
    info = tensorstream.inspect(http_server.url("insp/many.safetensors"))
    gets = http_server.requests_for("insp/many.safetensors", "GET")
    assert len(gets) == 2 and http_server.bytes_sent("insp/many.safetensors") == 8 + header_len
    assert len(info.tensors) == 3000


def test_tensorizer_file_from_its_index_only(http_server: HTTPTestServer, http_reset: None) -> None:
    tensors = _big()
    blob = _tz_bytes(tensors)
    http_server.put("insp/model.tensors", blob)
    http_server.clear_log()
    info = tensorstream.inspect(http_server.url("insp/model.tensors"))
    sent = http_server.bytes_sent("insp/model.tensors")
    assert sent == info.bytes_read and sent < 512 << 10, sent  # the index, not 8 MiB of tensors
    assert info.format == "tensorizer" and not info.encrypted and info.version is not None
    by_name = {t.name: t for t in info.tensors}
    assert sorted(by_name) == sorted(tensors)
    assert by_name["embed"].dtype == "bfloat16" and by_name["lm_head"].dtype == "float32"
    assert by_name["norm"].shape == (1024,) and by_name["norm"].nbytes == 2048
    lm = by_name["lm_head"]
    assert blob[lm.offset:lm.offset + lm.nbytes] == tensors["lm_head"].numpy().tobytes()


def test_encrypted_tensorizer_shows_what_is_in_the_clear(tmp_path: Path) -> None:
    from tensorizer import EncryptionParams

    tensors = {"a.w": torch.randn(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}
    (tmp_path / "enc.tensors").write_bytes(_tz_bytes(tensors, EncryptionParams.random()))
    info = tensorstream.inspect(tmp_path / "enc.tensors")
    assert info.encrypted
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in info.tensors] == [
        ("a.w", "float32", (3, 4), 48), ("b", "bfloat16", (5,), 10)]


def test_format_comes_from_the_bytes_not_the_name(tmp_path: Path) -> None:
    (tmp_path / "really-safetensors.tensors").write_bytes(
        _st_bytes({"x": torch.ones(2)}, tmp_path))
    (tmp_path / "really-tensorizer.safetensors").write_bytes(_tz_bytes({"y": torch.ones(2)}))
    (tmp_path / "index.txt").write_text(json.dumps({"weight_map": {"x": "m.safetensors"}}))
    assert tensorstream.inspect(tmp_path / "really-safetensors.tensors").format == "safetensors"
    assert tensorstream.inspect(tmp_path / "really-tensorizer.safetensors").format == "tensorizer"
    info = tensorstream.inspect(tmp_path / "index.txt")  # JSON: an index, whatever its name
    assert [t.name for t in info.tensors] == ["x"]


def _checkpoint(put: Any, tmp_path: Path) -> dict[str, Any]:
    g = torch.Generator().manual_seed(9)
    tensors = {f"layers.{i}.w": torch.randn(512, 256, generator=g) for i in range(4)}
    weight_map = {}
    for k, names in enumerate([["layers.0.w", "layers.1.w"], ["layers.2.w", "layers.3.w"]]):
        shard = f"model-0000{k + 1}-of-00002.safetensors"
        part = {n: tensors[n] for n in names}
        part["stale"] = torch.zeros(1)  # in both shards, not in the index: not listed
        put(shard, _st_bytes(part, tmp_path, {"format": "pt"}, shard))
        weight_map.update(dict.fromkeys(names, shard))
    index = {"metadata": {"total_size": 4 * 512 * 256 * 4}, "weight_map": weight_map}
    put("model.safetensors.index.json", json.dumps(index).encode())
    return tensors


def test_sharded_index_lists_each_tensors_shard(http_server: HTTPTestServer, http_reset: None,
                                               tmp_path: Path) -> None:
    _checkpoint(lambda k, d: http_server.put(f"ck/{k}", d), tmp_path)
    http_server.clear_log()
    info = tensorstream.inspect(http_server.url("ck/model.safetensors.index.json"))
    assert info.format == "safetensors" and len(info.files) == 2
    assert info.index_metadata == {"total_size": 2 * MiB} and info.metadata == {"format": "pt"}
    assert [(t.name, t.file.rsplit("/", 1)[-1]) for t in info.tensors] == [
        ("layers.0.w", "model-00001-of-00002.safetensors"),
        ("layers.1.w", "model-00001-of-00002.safetensors"),
        ("layers.2.w", "model-00002-of-00002.safetensors"),
        ("layers.3.w", "model-00002-of-00002.safetensors")]
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert http_server.bytes_sent(f"ck/{shard}") <= FIRST_READ  # headers, not 1 MiB shards
    assert info.bytes_read == http_server.bytes_sent()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_checkpoint_folder(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if where == "local":
        root = tmp_path / "ckpt"
        root.mkdir()
        _checkpoint(lambda k, d: (root / k).write_bytes(d), tmp_path)
        uri, options = str(root), {}
    else:
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        _checkpoint(lambda k, d: s3.put(S3_BUCKET, f"inspect-ck/{k}", d), tmp_path)
        uri, options = f"s3://{S3_BUCKET}/inspect-ck/", s3.options()
    info = tensorstream.inspect(uri, **options)
    assert [t.name for t in info.tensors] == [f"layers.{i}.w" for i in range(4)]
    assert info.total_bytes == 4 * 512 * 256 * 4 and info.index_metadata is not None


def test_redis_safetensors(redis_server: Any, tmp_path: Path) -> None:
    redis_server.put("insp-model", _st_bytes({"x": torch.ones(3)}, tmp_path))
    info = tensorstream.inspect(redis_server.url("insp-model"))
    assert [(t.name, t.dtype, t.shape) for t in info.tensors] == [("x", "F32", (3,))]


# -- hostile and damaged files -----------------------------------------------------------

def _hostile(tmp_path: Path) -> dict[str, bytes]:
    good = _st_bytes({"x": torch.ones(1000)}, tmp_path)
    tz = _tz_bytes({"x": torch.ones(1000)})
    return {
        "truncated.safetensors": good[:len(good) - 100],
        "truncated-header.safetensors": good[:20],
        "huge-header.safetensors": struct.pack("<Q", 1 << 62) + b"{}",
        "bad-json.safetensors": struct.pack("<Q", 8) + b"{nope!!}",
        "short.safetensors": b"abc",
        "truncated.tensors": tz[:100_000],
        "not-a-model.bin": b"\x7fELF" + bytes(200),
        "bad-index.json": b"{not json",
        "empty.bin": b"",
    }


@pytest.mark.parametrize("name", ["truncated.safetensors", "truncated-header.safetensors",
                                  "huge-header.safetensors", "bad-json.safetensors",
                                  "short.safetensors", "truncated.tensors", "not-a-model.bin",
                                  "bad-index.json", "empty.bin"])
def test_hostile_files_raise_naming_the_file(name: str, tmp_path: Path) -> None:
    (tmp_path / name).write_bytes(_hostile(tmp_path)[name])
    with pytest.raises(MalformedFileError) as exc:
        tensorstream.inspect(tmp_path / name)
    assert name in str(exc.value)


def test_huge_header_length_is_never_fetched(http_server: HTTPTestServer, http_reset: None) -> None:
    blob = struct.pack("<Q", 50_000_000) + b"{" + bytes(4 * MiB)  # a length inside the cap
    http_server.put("insp/liar.safetensors", blob)
    http_server.clear_log()
    with pytest.raises(MalformedFileError, match=r"liar\.safetensors is truncated"):
        tensorstream.inspect(http_server.url("insp/liar.safetensors"))
    assert http_server.bytes_sent("insp/liar.safetensors") <= FIRST_READ


def test_missing_object(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        tensorstream.inspect(tmp_path / "nope.safetensors")


def test_a_prefix_named_without_its_slash_says_to_add_it(redis_server: Any,
                                                          tmp_path: Path) -> None:
    """``inspect s3://b/llama`` (a prefix) said only "no such object", where ``convert``
    says to end a prefix with '/'."""
    redis_server.put("insp-prefix/model.safetensors", _st_bytes({"x": torch.ones(3)}, tmp_path))
    with pytest.raises(NotFoundError, match="end it with '/'") as exc:
        tensorstream.inspect(redis_server.url("insp-prefix"))
    assert str(exc.value).endswith(redis_server.url("insp-prefix/"))
    assert len(tensorstream.inspect(redis_server.url("insp-prefix/")).tensors) == 1
    with pytest.raises(NotFoundError) as exc:  # a file's name: no hint
        tensorstream.inspect(redis_server.url("insp-prefix/none.safetensors"))
    assert "end it with" not in str(exc.value)


def test_model_info_is_public() -> None:
    assert tensorstream.ModelInfo is ModelInfo


def test_tensorizer_index_length_past_the_object_is_never_fetched(
        http_server: HTTPTestServer, http_reset: None) -> None:
    blob = bytearray(_tz_bytes({"x": torch.ones(1000)}))
    index_len_at = 5 + 4 + 56  # magic, version, file header
    struct.pack_into("<Q", blob, index_len_at, 1 << 60)
    http_server.put("insp/liar.tensors", bytes(blob) + bytes(4 * MiB))
    http_server.clear_log()
    with pytest.raises(MalformedFileError, match=r"liar\.tensors .*index claims"):
        tensorstream.inspect(http_server.url("insp/liar.tensors"))
    assert http_server.bytes_sent("insp/liar.tensors") <= FIRST_READ


@functools.cache
def _small_tensorizer() -> bytes:
    return _tz_bytes({"a": torch.ones(3, 4), "b.c": torch.zeros(2, dtype=torch.bfloat16)})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.integers(min_value=0, max_value=1_000_000),
                                st.integers(min_value=0, max_value=255)), min_size=1, max_size=4),
       cut=st.integers(min_value=0, max_value=400))
def test_fuzzed_tensorizer_indexes_are_valid_or_rejected(flips: list[tuple[int, int]],
                                                         cut: int) -> None:
    """Damage the header and index of a real tensorizer file (and maybe cut its end):
    read_index either raises MalformedFileError naming it, or returns entries that the
    object can back."""
    from tensorstream.tensorizer.hook import read_index

    blob = bytearray(_small_tensorizer())
    hot = 5 + 4 + 56 + 8 + 200  # the header and the start of the index (its entries)
    for at, value in flips:
        blob[at % hot if at % 3 else at % len(blob)] = value
    blob = blob[: len(blob) - cut]
    try:
        index = read_index(bytes(blob[:FIRST_READ]), len(blob), "fuzz.tensors",
                           lambda o, n: bytes(blob[o : o + n]))
    except MalformedFileError as exc:
        assert "fuzz.tensors" in str(exc)
        return
    for e in index.entries:
        assert 0 <= e.header_offset <= e.data_offset and e.data_offset + e.nbytes <= len(blob)
