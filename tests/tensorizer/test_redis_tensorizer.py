"""tensorizer compatibility, both ways: to_redis prefixes read by tensorstream, and
tensorstream-written objects read by tensorizer's own ``redis://`` loader."""

from __future__ import annotations

import errno
import os

import pytest

import tensorstream
from reliability_helpers import file_size_limit
from tensorstream.testing.redis_server import RedisServer

torch = pytest.importorskip("torch")
tensorizer = pytest.importorskip("tensorizer")
from tensorizer import TensorDeserializer, TensorSerializer  # noqa: E402


def _state_dict(total_bytes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = max(4, total_bytes // 24)  # six float32 tensors of n elements
    sd = {f"layer.{i}.weight": torch.randn(n // 4, 4, generator=g) for i in range(6)}
    sd["layer.6.bias"] = torch.arange(1000, dtype=torch.int64)
    sd["half"] = torch.randn(333, dtype=torch.float32, generator=g).to(torch.float16)
    sd["empty"] = torch.zeros(0)
    return sd


def _serialize(sd: dict[str, torch.Tensor], tmp_path: object) -> str:
    path = f"{tmp_path}/model.tensors"
    s = TensorSerializer(path)
    s.write_state_dict(sd)
    s.close()
    return path


def _assert_equal(loaded: object, sd: dict[str, torch.Tensor]) -> None:
    assert sorted(loaded.keys()) == sorted(sd)  # type: ignore[attr-defined]
    for name, tensor in sd.items():
        got = loaded[name]  # type: ignore[index]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name


def test_reads_prefix_written_by_to_redis(redis_server: RedisServer, tmp_path: object) -> None:
    sd = _state_dict(2 << 20)
    path = _serialize(sd, tmp_path)
    with redis_server.client() as c:
        TensorDeserializer(path, device="cpu", lazy_load=True).to_redis(c, "tz/[to_redis]*")
        c.set("tz/[to_redis]*x:other:0", b"must not be picked up")  # glob chars escaped
    uri = redis_server.url("tz/[to_redis]*")
    with tensorstream.open(uri) as f:
        assert f.info.extra["layout"] == "tensorizer"
        d = TensorDeserializer(f, device="cpu")
        _assert_equal(d, sd)
        d.close()


def _write_with_tensorstream(uri: str, data: bytes, **opts: object) -> None:
    with tensorstream.open(uri, "wb", **opts) as w:
        for i in range(0, len(data), 3 << 20):
            w.write(data[i : i + (3 << 20)])


def test_tensorizer_own_loader_reads_what_tensorstream_wrote(
    redis_server: RedisServer, tmp_path: object
) -> None:
    sd = _state_dict(3 << 20, seed=1)
    with open(_serialize(sd, tmp_path), "rb") as f:
        data = f.read()
    uri = redis_server.url("compat/written-by-tensorstream")
    # Overwrite once so the loader must see only the current generation's chunks.
    _write_with_tensorstream(uri, b"old generation" * 100_000, redis_chunk_size=64 << 10)
    _write_with_tensorstream(uri, data, redis_chunk_size=200_000)
    d = TensorDeserializer(uri, device="cpu")  # tensorizer.stream_io.RedisStreamFile
    _assert_equal(d, sd)
    d.close()
    stream = tensorizer.stream_io.open_stream(uri, "rb")
    try:
        assert stream.read() == data
    finally:
        stream.close()


def test_64mib_model_round_trip(redis_server: RedisServer, tmp_path: object) -> None:
    sd = _state_dict(64 << 20, seed=2)
    with open(_serialize(sd, tmp_path), "rb") as fh:
        data = fh.read()
    assert len(data) > 60 << 20
    uri = redis_server.url("compat/64mib")
    _write_with_tensorstream(uri, data)
    with tensorstream.open(uri) as f:
        assert f.size == len(data)
        d = TensorDeserializer(f, device="cpu")
        _assert_equal(d, sd)
        d.close()


def test_deserialize_defaults_to_one_reader_and_blocking_reads(
        redis_server: RedisServer, tmp_path: object) -> None:
    """One Redis thread serves every request: parallel readers only queue, so the
    default is one reader, fed by the read-ahead's worker threads."""
    sd = _state_dict(8 << 20, seed=3)
    with open(_serialize(sd, tmp_path), "rb") as fh:
        data = fh.read()
    uri = redis_server.url("compat/readers")
    _write_with_tensorstream(uri, data)
    with tensorstream.deserialize(uri, device="cpu") as d:
        assert d._num_readers == 1
        _assert_equal(d, sd)
    with tensorstream.open(uri) as f:
        assert f.capabilities.blocking_reads and f.read_hints.serial_server
        assert f.read() == data
        assert f.read_stats()["direct_bytes"] > 0


def test_serialize_out_of_local_room_names_its_temporary_copy(
        redis_server: RedisServer, tmp_path: object) -> None:
    """serialize() to a remote URI first makes the whole file in a local temporary
    directory (tensorizer seeks). A full disk there was a bare "[Errno 28] No
    space left on device" while the user wrote to Redis: which disk? It names
    the temporary file and says to set TMPDIR. Nothing is published, nothing left."""
    from tensorstream.tensorizer import serialize

    sd = {"w": torch.randn(512, 1024)}  # 2 MiB
    with file_size_limit(1 << 20), pytest.raises(OSError) as info:
        serialize(sd, redis_server.url("ser/no-room"))
    assert info.value.errno == errno.EFBIG, info.value
    assert "TMPDIR" in str(info.value) and "redis://" in str(info.value)
    assert str(info.value.filename).endswith("model.tensors")
    assert not os.path.exists(os.path.dirname(str(info.value.filename)))  # removed
    with redis_server.client() as c:
        assert list(c.scan_iter(match="ser/no-room*")) == []
    # A local destination: named itself (its temporary file is beside it).
    dst = f"{tmp_path}/model.tensors"
    with file_size_limit(1 << 20), pytest.raises(OSError) as info:
        serialize(sd, dst)
    assert info.value.errno == errno.EFBIG and info.value.filename == dst, info.value
    assert os.listdir(str(tmp_path)) == []
