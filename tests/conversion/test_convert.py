"""tensorstream.convert: safetensors <-> tensorizer on every backend, byte-exact, checked by
tensorizer's own TensorDeserializer and safetensors' load; bounded memory; hostile input."""

from __future__ import annotations

import dataclasses
import errno
import gc
import io
import json
import os
import re
import secrets
import struct
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from reliability_helpers import file_size_limit
from tensorstream.conversion import DestinationExistsError, UnsupportedDtypeError
from tensorstream.errors import (
    ConfigurationError,
    MalformedFileError,
    UnsupportedOperationError,
)
from tensorstream.tensorizer import DecryptionError, Encryption

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")

from tensor_files import one_per_dtype, same_bytes  # noqa: E402  (needs torch)


def checkpoint() -> dict[str, Any]:
    """One tensor per dtype safetensors.torch maps (fp8 included), 0-dim, empty, 1 MB."""
    g = torch.Generator().manual_seed(3)
    out = one_per_dtype(g, (17, 9), "layers.0.")
    out["scalar"] = torch.tensor(1.25)
    out["empty"] = torch.empty(0, 5)  # f32: bf16/fp8 empties are refused (see below)
    out["big.weight"] = torch.randn(512, 512, generator=g)
    return out


def assert_same(got: Any, want: dict[str, Any]) -> None:
    assert sorted(got.keys()) == sorted(want)
    for name, t in want.items():
        assert same_bytes(got[name], t), name


def st_bytes(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    return st_torch.save(tensors, metadata=metadata)


def sharded(tensors: dict[str, Any], shards: int = 3) -> dict[str, bytes]:
    """``{file name: bytes}`` of a checkpoint written by safetensors, with its index."""
    names = sorted(tensors)
    files: dict[str, bytes] = {}
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        files[shard] = st_bytes(part, {"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
    return files


@dataclasses.dataclass
class Store:
    """A writable backend: ``uri(key)``, ``put(key, bytes)``, options; reads go through
    tensorstream (Redis holds written objects in its chunked layout)."""

    name: str
    uri: Callable[[str], str]
    put: Callable[[str, bytes], None]
    options: dict[str, Any]
    exists: Callable[[str], bool]

    def get(self, key: str) -> bytes:
        with tensorstream.open(self.uri(key), **self.options) as f:
            return bytes(f.read())


def _store(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    prefix = f"cv{secrets.token_hex(4)}/"
    if name == "local":
        root = tmp_path / "store"
        root.mkdir()

        def put(k: str, d: bytes) -> None:
            (root / k).parent.mkdir(parents=True, exist_ok=True)
            (root / k).write_bytes(d)

        return Store(name, lambda k: str(root / k), put, {}, lambda k: (root / k).exists())
    if name == "s3":
        s3 = request.getfixturevalue("moto_s3")
        request.getfixturevalue("isolated_env")
        return Store(name, lambda k: f"s3://{S3_BUCKET}/{prefix}{k}",
                     lambda k, d: s3.put(S3_BUCKET, prefix + k, d), s3.options(),
                     lambda k: s3.exists(S3_BUCKET, prefix + k))
    if name == "redis":
        server = request.getfixturevalue("redis_server")
        rp = prefix.rstrip("/") + "-"

        def exists(k: str) -> bool:
            try:
                tensorstream.open(server.url(rp + k)).close()
            except FileNotFoundError:
                return False
            return True

        return Store(name, lambda k: server.url(rp + k), lambda k, d: server.put(rp + k, d), {},
                     exists)
    raise AssertionError(name)


@pytest.fixture(params=["local", "s3", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return _store(request.param, request, tmp_path)


def tensorizer_read(blob: bytes, key: bytes | None = None) -> dict[str, Any]:
    """tensorizer's own TensorDeserializer over the bytes (no tensorstream involved)."""
    decryption = tensorizer.DecryptionParams.from_key(key) if key else None
    with tensorizer.TensorDeserializer(io.BytesIO(blob), device="cpu",
                                       encryption=decryption) as d:
        return {k: d[k].detach().clone() for k in d.keys()}  # noqa: SIM118 - a Mapping


# -- round trips -----------------------------------------------------------------------


def test_local_single_file_round_trip_every_dtype(tmp_path: Path) -> None:
    want = checkpoint()
    src = tmp_path / "model.safetensors"
    st_torch.save_file(want, str(src), metadata={"format": "pt", "note": "é"})
    seen: list[tuple[int, int]] = []
    result = tensorstream.convert(str(src), str(tmp_path / "model.tensors"),
                                  progress=lambda d, t: seen.append((d, t)))
    total = sum(t.numel() * t.element_size() for t in want.values())
    assert (result.src_format, result.dst_format) == ("safetensors", "tensorizer")
    assert result.tensors == len(want) and result.bytes == total
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) == len(want) + 1
    assert result.notes and "note" in result.notes[0] and "format" not in result.notes[0]
    blob = (tmp_path / "model.tensors").read_bytes()
    assert_same(tensorizer_read(blob), want)
    with tensorstream.deserialize(str(tmp_path / "model.tensors")) as d:
        assert_same(d, want)

    (tmp_path / "back").mkdir()
    back = tensorstream.convert(str(tmp_path / "model.tensors"), str(tmp_path / "back"),
                                metadata={"source": "test"})
    assert back.dst.endswith("model.safetensors")  # a directory: the source's name
    assert_same(st_torch.load_file(str(tmp_path / "back" / "model.safetensors")), want)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "back" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "source": "test"}
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_sharded_encrypted_round_trip(store: Store) -> None:
    want = checkpoint()
    del want["empty"]  # tensorizer 2.12 cannot encrypt it (see the refusal test below)
    for name, blob in sharded(want).items():
        store.put(f"llama/{name}", blob)
    key = secrets.token_bytes(32)
    keyfile = store.uri("keys/llama.key")
    store.put("keys/llama.key", key)
    opts = store.options
    src = store.uri("llama/model.safetensors.index.json")
    result = tensorstream.convert(src, store.uri("llama.tensors"),
                                  encryption=Encryption(keyfile=keyfile), **opts)
    assert result.encrypted and result.tensors == len(want)
    blob = store.get("llama.tensors")
    assert_same(tensorizer_read(blob, key), want)  # tensorizer's own reader, decrypting
    with pytest.raises(Exception, match=r"(?i)decrypt|encrypt"):
        tensorizer_read(blob)  # really encrypted
    with tensorstream.deserialize(store.uri("llama.tensors"), encryption=key, **opts) as d:
        assert_same(d, want)

    tensorstream.convert(store.uri("llama.tensors"), store.uri("llama.safetensors"),
                         encryption=Encryption(keyfile=keyfile), **opts)
    assert_same(st_torch.load(store.get("llama.safetensors")), want)
    assert_same(tensorstream.safetensors.load(store.uri("llama.safetensors"), **opts), want)


def test_folder_source_and_folder_destination_on_s3(request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    s3 = _store("s3", request, tmp_path)
    want = {"a": torch.arange(6.0), "b.c": torch.ones(2, 2, dtype=torch.float16)}
    for name, blob in sharded(want, 2).items():
        s3.put(f"ckpt/{name}", blob)
    result = tensorstream.convert(s3.uri("ckpt/"), s3.uri("out/"), **s3.options)
    assert result.dst == s3.uri("out/model.tensors")
    assert_same(tensorizer_read(s3.get("out/model.tensors")), want)
    # the prefix without its "/" is no object: the error says how to name the prefix
    with pytest.raises(tensorstream.errors.NotFoundError,
                       match=re.escape(f"end it with '/': {s3.uri('ckpt')}/")):
        tensorstream.convert(s3.uri("ckpt"), s3.uri("out/"), **s3.options)


def test_a_hugging_face_cache_snapshot_folder(tmp_path: Path) -> None:
    # snapshots/REV/ holds symbolic links into blobs/, as huggingface_hub lays it out
    want = {"a": torch.arange(6.0), "b.c": torch.ones(2, 2, dtype=torch.bfloat16)}
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for i, (name, blob) in enumerate(sharded(want, 2).items()):
        (blobs / f"{i:040x}").write_bytes(blob)
        (snap / name).symlink_to(blobs / f"{i:040x}")
    tensorstream.convert(str(snap), str(tmp_path / "m.tensors"))
    assert_same(tensorizer_read((tmp_path / "m.tensors").read_bytes()), want)


def test_fsspec_fallback_sharded_round_trip() -> None:
    # memory:// goes through the generic fsspec provider (third-party backends do too)
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/convert-{secrets.token_hex(4)}"
    want = checkpoint()
    del want["empty"]
    for name, blob in sharded(want, 2).items():
        fs.pipe_file(f"{root}/ckpt/{name}", blob)
    key = secrets.token_bytes(32)
    tensorstream.convert(f"memory://{root}/ckpt/model.safetensors.index.json",
                         f"memory://{root}/m.tensors", encryption=key)
    assert_same(tensorizer_read(fs.cat_file(f"{root}/m.tensors"), key), want)
    tensorstream.convert(f"memory://{root}/m.tensors", f"memory://{root}/m.safetensors",
                         encryption=key)
    assert_same(st_torch.load(fs.cat_file(f"{root}/m.safetensors")), want)


def test_http_sources_are_read_for_both_directions(http_server: Any, http_reset: None,
                                                   tmp_path: Path) -> None:
    want = checkpoint()
    st_torch.save_file({"w": torch.ones(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(UnsupportedOperationError, match="cannot be written"):
        tensorstream.convert(str(tmp_path / "x.safetensors"), http_server.url("x.tensors"),
                             **http_server.options)
    tmp = tmp_path / "m.tensors"
    tensorstream.serialize(want, str(tmp))  # what tensorstream.serialize writes converts too
    http_server.put("m.safetensors", st_bytes(want))
    http_server.put("m.tensors", tmp.read_bytes())
    opts = dict(http_server.options)
    tensorstream.convert(http_server.url("m.safetensors"), str(tmp_path / "a.tensors"), **opts)
    assert_same(tensorizer_read((tmp_path / "a.tensors").read_bytes()), want)
    tensorstream.convert(http_server.url("m.tensors"), str(tmp_path / "b.safetensors"), **opts)
    assert_same(st_torch.load_file(str(tmp_path / "b.safetensors")), want)


def test_passphrase_and_a_module_file(tmp_path: Path) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    src = tmp_path / "module.tensors"
    cheap = {"opslimit": 1, "memlimit": 8192}  # Argon2id at its minimum cost: a fast test
    tensorstream.serialize(module, str(src), encryption=Encryption(passphrase="pw", **cheap))
    tensorstream.convert(str(src), str(tmp_path / "m.safetensors"),
                         encryption=Encryption(passphrase="pw"))
    got = st_torch.load_file(str(tmp_path / "m.safetensors"))
    assert_same(got, {k: v for k, v in module.state_dict().items()})
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "again.tensors"),
                         encryption=Encryption(passphrase="other", **cheap))
    with tensorstream.deserialize(str(tmp_path / "again.tensors"),
                                  encryption=Encryption(passphrase="other")) as d:
        assert_same(d, module.state_dict())


def test_result_loads_into_a_module_through_tensorstream(tmp_path: Path) -> None:
    module = torch.nn.Linear(5, 2)
    st_torch.save_file(module.state_dict(), str(tmp_path / "l.safetensors"))
    tensorstream.convert(str(tmp_path / "l.safetensors"), str(tmp_path / "l.tensors"))
    fresh = torch.nn.Linear(5, 2)
    tensorstream.load_into_module(fresh, str(tmp_path / "l.tensors"))
    assert_same(fresh.state_dict(), module.state_dict())


# -- bounded memory ----------------------------------------------------------------------


def _alive(refs: list[weakref.ref[Any]]) -> int:
    gc.collect()
    return sum(r() is not None for r in refs)


@pytest.mark.parametrize(("batch", "bound"), [(1, 2), (2048, 3)])
def test_to_tensorizer_holds_one_batch_and_one_tensor(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      batch: int, bound: int) -> None:
    from tensorstream.conversion import to_tensorizer
    from tensorstream.safetensors.reader import SafetensorsFile

    # 1 KiB tensors: batches of one, then of two tensors
    monkeypatch.setattr(to_tensorizer, "BATCH_BYTES", batch)
    want = {f"t{i:02d}": torch.full((256,), float(i)) for i in range(6)}
    st_torch.save_file(want, str(tmp_path / "m.safetensors"))
    refs: list[weakref.ref[Any]] = []
    most = [0]
    real = SafetensorsFile.read_tensor

    def spy(self: Any, *a: Any, **kw: Any) -> Any:
        most[0] = max(most[0], _alive(refs))  # before this one is allocated
        t = real(self, *a, **kw)
        refs.append(weakref.ref(t))
        return t

    monkeypatch.setattr(SafetensorsFile, "read_tensor", spy)
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert len(refs) == 6 and most[0] <= bound
    assert_same(tensorizer_read((tmp_path / "m.tensors").read_bytes()), want)


def test_to_safetensors_releases_each_batch(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorstream.conversion import to_safetensors

    want = {f"t{i:02d}": torch.full((1024,), float(i)) for i in range(6)}
    tensorstream.serialize(want, str(tmp_path / "m.tensors"))
    monkeypatch.setattr(to_safetensors, "BATCH_BYTES", 8192)  # two tensors per batch
    refs: list[weakref.ref[Any]] = []
    most = [0]
    real = to_safetensors._load

    def spy(*a: Any, **kw: Any) -> Any:
        most[0] = max(most[0], _alive(refs))  # what earlier batches left loaded
        got = real(*a, **kw)
        refs.extend(weakref.ref(t) for t in got.values())
        return got

    monkeypatch.setattr(to_safetensors, "_load", spy)
    tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    assert len(refs) == 6 and most[0] == 0  # tensorizer's cache let go of every batch
    assert_same(st_torch.load_file(str(tmp_path / "m.safetensors")), want)


# -- refusals and damaged input ------------------------------------------------------------


def _clean(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_wrong_key_and_missing_key_write_nothing(store: Store) -> None:
    want = {"w": torch.randn(64, 8)}
    store.put("m.safetensors", st_bytes(want))
    tensorstream.convert(store.uri("m.safetensors"), store.uri("m.tensors"),
                         encryption=secrets.token_bytes(32), **store.options)
    for encryption in (secrets.token_bytes(32), None):
        with pytest.raises(DecryptionError, match=r"could not decrypt|"
                                                  r"is encrypted and no key was given"):
            tensorstream.convert(store.uri("m.tensors"), store.uri("back.safetensors"),
                                 encryption=encryption, **store.options)
        assert not store.exists("back.safetensors")


def test_existing_destination_needs_overwrite(store: Store) -> None:
    store.put("m.safetensors", st_bytes({"w": torch.ones(3)}))
    store.put("m.tensors", b"precious")
    with pytest.raises(DestinationExistsError, match="--overwrite"):
        tensorstream.convert(store.uri("m.safetensors"), store.uri("m.tensors"), **store.options)
    assert store.get("m.tensors") == b"precious"
    tensorstream.convert(store.uri("m.safetensors"), store.uri("m.tensors"), overwrite=True,
                         **store.options)
    assert_same(tensorizer_read(store.get("m.tensors")), {"w": torch.ones(3)})


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_empty_tensor_tensorizer_cannot_read_back_is_refused_first(tmp_path: Path,
                                                                    dtype: str) -> None:
    st_torch.save_file({"ok": torch.ones(2), "e": torch.empty(0, 4, dtype=getattr(torch, dtype))},
                       str(tmp_path / "m.safetensors"))
    with pytest.raises(UnsupportedDtypeError, match=r"'e' is empty .*cannot read back"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert _clean(tmp_path) == ["m.safetensors"]


def test_empty_tensor_with_encryption_is_refused(tmp_path: Path) -> None:
    st_torch.save_file({"e": torch.empty(0)}, str(tmp_path / "m.safetensors"))
    key = tmp_path / "k.key"
    with pytest.raises(UnsupportedDtypeError, match="cannot encrypt an empty tensor"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"),
                             encryption=Encryption(keyfile=str(key)))
    assert _clean(tmp_path) == ["m.safetensors"]  # not even a key file was made


@pytest.mark.parametrize(("name", "shape", "why"), [
    ("", [2], "cannot hold the tensor name ''"),  # wrote a file tensorizer cannot read
    ("n" * 65536, [2], "cannot hold the tensor name"),  # was a bare struct.error
    ("deep", [1] * 63 + [2, 1], "has 65 dimensions"),  # was numpy's bare ValueError
])
def test_what_tensorizer_cannot_hold_is_refused_first(tmp_path: Path, name: str,
                                                      shape: list[int], why: str) -> None:
    body = json.dumps({"ok": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       name: {"dtype": "F32", "shape": shape, "data_offsets": [4, 12]}}).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + bytes(12))
    with pytest.raises(UnsupportedDtypeError, match=re.escape(why)):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert _clean(tmp_path) == ["m.safetensors"]


def test_state_dict_names_with_dots_are_kept(tmp_path: Path) -> None:
    # a leading "." was stripped from every name (meant for write_module's ".weight"):
    # ".lead" came back as "lead", and "..x" as "x"
    names = [".lead", "..x", "trail.", "a..b", "a.b", "é", "[0]", " "]
    want = {n: torch.full((2,), float(i)) for i, n in enumerate(names)}
    st_torch.save_file(want, str(tmp_path / "m.safetensors"))
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "back.safetensors"))
    assert_same(st_torch.load_file(str(tmp_path / "back.safetensors")), want)


def test_a_destination_that_is_a_directory_is_refused_first(tmp_path: Path) -> None:
    # dst/ names dst/m.tensors; that one is a directory: overwrite=True converted everything,
    # then failed renaming onto it with a bare IsADirectoryError
    st_torch.save_file({"w": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    (tmp_path / "out" / "m.tensors").mkdir(parents=True)
    for overwrite in (False, True):
        with pytest.raises(tensorstream.errors.TensorstreamError,
                           match="destination is a directory"):
            tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "out") + "/",
                                 overwrite=overwrite)
    assert os.listdir(tmp_path / "out") == ["m.tensors"]
    assert os.listdir(tmp_path / "out" / "m.tensors") == []


def test_a_checkpoint_without_tensors_is_refused_first(tmp_path: Path) -> None:
    # tensorizer 2.12 writes a file holding no tensor, but cannot read it back
    st_torch.save_file({}, str(tmp_path / "m.safetensors"))
    with pytest.raises(UnsupportedDtypeError, match="holds no tensor"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert _clean(tmp_path) == ["m.safetensors"]
    # an index naming no shard: was a bare IndexError
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(UnsupportedDtypeError, match=r"index\.json: the checkpoint holds no"):
        tensorstream.convert(str(tmp_path / "model.safetensors.index.json"),
                             str(tmp_path / "m.tensors"))
    assert _clean(tmp_path) == ["m.safetensors", "model.safetensors.index.json"]


def test_dtype_safetensors_cannot_hold_is_refused(tmp_path: Path) -> None:
    tensorstream.serialize({"ok": torch.ones(2), "z": torch.ones(2, dtype=torch.complex128)},
                           str(tmp_path / "m.tensors"))
    with pytest.raises(UnsupportedDtypeError, match=r"'z' has dtype .*complex128.*safetensors"):
        tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    assert _clean(tmp_path) == ["m.tensors"]


def test_a_tensor_named_like_the_metadata_key_is_refused(tmp_path: Path) -> None:
    # was written as the header's "__metadata__": a file neither safetensors nor we could load
    tensorstream.serialize({"ok": torch.ones(2), "__metadata__": torch.ones(2)},
                           str(tmp_path / "m.tensors"))
    with pytest.raises(UnsupportedDtypeError, match=r"'__metadata__'.*reserves"):
        tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    assert _clean(tmp_path) == ["m.tensors"]


def test_truncated_sources_raise_and_write_nothing(store: Store, tmp_path: Path) -> None:
    want = {"a": torch.randn(300, 40), "b": torch.randn(300, 40)}
    blob = st_bytes(want)
    store.put("cut.safetensors", blob[: len(blob) - 1000])
    with pytest.raises(MalformedFileError, match="truncated"):
        tensorstream.convert(store.uri("cut.safetensors"), store.uri("cut.tensors"),
                             **store.options)
    assert not store.exists("cut.tensors")

    tensorstream.serialize(want, str(tmp_path / "whole.tensors"))
    whole = (tmp_path / "whole.tensors").read_bytes()
    store.put("cut2.tensors", whole[: len(whole) - 1000])
    with pytest.raises(MalformedFileError, match="not a whole tensorizer file"):
        tensorstream.convert(store.uri("cut2.tensors"), store.uri("cut2.safetensors"),
                             **store.options)
    assert not store.exists("cut2.safetensors")


@pytest.mark.parametrize("start", [b"|TZX|", b"\x00TZR|", b"", b"PK\x03\x04"])
def test_a_source_of_neither_format_is_called_malformed(tmp_path: Path, start: bytes) -> None:
    """A tensorizer file whose magic is damaged (or anything else that is neither format)
    was taken for safetensors, and refused with a ConfigurationError (exit 2) telling to
    name the destination *.tensors: the source is the problem, and its error says so."""
    tensorstream.serialize({"a": torch.ones(4)}, str(tmp_path / "m.tensors"))
    whole = (tmp_path / "m.tensors").read_bytes()
    (tmp_path / "m.tensors").write_bytes(start + whole[len(start):] if start else b"")
    for dst in ("m.safetensors", "m2.tensors"):
        with pytest.raises(MalformedFileError, match=r"m\.tensors.*not a tensorizer file either"):
            tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / dst))
    assert _clean(tmp_path) == ["m.tensors"]


@pytest.mark.parametrize("direction", ["to_tensorizer", "to_safetensors"])
def test_interrupted_conversion_leaves_nothing(store: Store, tmp_path: Path,
                                              direction: str) -> None:
    want = {f"t{i}": torch.randn(100) for i in range(6)}
    if direction == "to_tensorizer":
        store.put("m.safetensors", st_bytes(want))
        src, dst = "m.safetensors", "m.tensors"
    else:
        tensorstream.serialize(want, str(tmp_path / "m.tensors"))
        store.put("src.tensors", (tmp_path / "m.tensors").read_bytes())
        src, dst = "src.tensors", "m.safetensors"

    def stop(done: int, total: int) -> None:
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tensorstream.convert(store.uri(src), store.uri(dst), progress=stop, **store.options)
    assert not store.exists(dst)
    if store.name == "local":
        assert not [p for p in Path(store.uri(src)).parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("direction", ["to_tensorizer", "to_safetensors"])
def test_a_local_destination_is_on_disk_unless_durable_false(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direction: str) -> None:
    want = {"w": torch.randn(8)}
    if direction == "to_tensorizer":
        st_torch.save_file(want, str(tmp_path / "m.safetensors"))
        src, dst = tmp_path / "m.safetensors", tmp_path / "m.tensors"
    else:
        tensorstream.serialize(want, str(tmp_path / "m.tensors"))
        src, dst = tmp_path / "m.tensors", tmp_path / "m.safetensors"
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    tensorstream.convert(str(src), str(dst), durable=False)
    assert synced == []
    tensorstream.convert(str(src), str(dst), overwrite=True)
    assert len(synced) == 2  # the file before its rename, then its directory


def test_usage_errors(tmp_path: Path) -> None:
    st_torch.save_file({"w": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(ConfigurationError, match="tensorstream cp"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "x.safetensors"))
    with pytest.raises(ConfigurationError, match="cannot hold metadata"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "x.tensors"),
                             metadata={"a": "b"})
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    for bad in ([("a", "b")], {"a": 1}):  # a list was a bare AttributeError
        with pytest.raises(ConfigurationError, match="metadata must map strings"):
            tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "x.safetensors"),
                                 metadata=bad)  # type: ignore[arg-type]
    (tmp_path / "x.safetensors").write_bytes(b"precious")
    for kwargs in ({"overwrite": "no"}, {"durable": "no"}, {"progress": 5},
                   {"src_options": [1]}, {"dst_options": "part_size=1"}):
        # overwrite="no" replaced the destination; the others were bare TypeErrors
        name = next(iter(kwargs))
        with pytest.raises(ConfigurationError, match=f"{name}= takes"):
            tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "x.safetensors"),
                                 **kwargs)  # type: ignore[arg-type]
    assert (tmp_path / "x.safetensors").read_bytes() == b"precious"
    os.unlink(tmp_path / "x.safetensors")
    os.unlink(tmp_path / "m.tensors")
    with pytest.raises(FileNotFoundError, match="destination directory"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "no" / "x.tensors"))
    with pytest.raises(FileNotFoundError):
        tensorstream.convert(str(tmp_path / "missing.safetensors"), str(tmp_path / "x.tensors"))
    assert _clean(tmp_path) == ["m.safetensors"]
    assert os.path.exists(tmp_path / "m.safetensors")


@pytest.mark.parametrize("fmt", ["safetensors", "tensorizer"])
@pytest.mark.parametrize("spelling", ["./model", "abs", "file://abs", "sub/../model",
                                      "linked/model"])
def test_the_source_under_another_spelling_is_not_a_destination(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, spelling: str) -> None:
    """Only the same text was refused: ``convert --overwrite model ./model`` (a file named
    without a suffix) replaced the source with its conversion; without --overwrite the
    error's advice was to pass it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path)
    want = {"w": torch.randn(4, 4)}
    if fmt == "safetensors":
        st_torch.save_file(want, "model")
    else:
        tensorstream.serialize(want, "model")
    before = (tmp_path / "model").read_bytes()
    dst = {"abs": str(tmp_path / "model"),
           "file://abs": (tmp_path / "model").as_uri()}.get(spelling, spelling)
    for overwrite in (False, True):
        with pytest.raises(ConfigurationError, match="source and destination are the same"):
            tensorstream.convert("model", dst, overwrite=overwrite)
    assert (tmp_path / "model").read_bytes() == before
    assert _clean(tmp_path) == ["linked", "model", "sub"]
    # a symlink at the destination is replaced, not followed: the source stays as it is
    (tmp_path / "link").symlink_to(tmp_path / "model")
    tensorstream.convert("model", "link", overwrite=True)
    assert not (tmp_path / "link").is_symlink()
    assert (tmp_path / "model").read_bytes() == before


def test_uris_that_differ_only_in_a_secret_are_different_objects(tmp_path: Path) -> None:
    """Two names that differ only in a secret (``?token=A``/``?token=B``) were compared
    redacted (``?token=***`` both) and refused as "the same"; they name two objects."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/same-{secrets.token_hex(4)}"
    want = {"w": torch.randn(4, 4)}
    tensorstream.serialize(want, str(tmp_path / "m.tensors"))
    blob = (tmp_path / "m.tensors").read_bytes()
    fs.pipe_file(f"{root}/m?token=A", blob)
    tensorstream.convert(f"memory://{root}/m?token=A", f"memory://{root}/m?token=B")
    assert_same(st_torch.load(fs.cat_file(f"{root}/m?token=B")), want)
    assert fs.cat_file(f"{root}/m?token=A") == blob
    # the same name is still refused, secret and all; nothing is written
    with pytest.raises(ConfigurationError, match="source and destination are the same") as info:
        tensorstream.convert(f"memory://{root}/m?token=A", f"memory://{root}/m?token=A",
                             overwrite=True)
    assert "token=A" not in str(info.value) and "token=***" in str(info.value)
    assert fs.cat_file(f"{root}/m?token=A") == blob


def test_one_redis_key_under_other_credentials_is_the_same_object(
        redis_auth_server: Any, tmp_path: Path) -> None:
    """The credentials do not name the object: one Redis key reached as the default user
    (``:pw@``), as ``default:pw@`` or as an ACL user is refused; no secret is shown (those
    spellings were compared redacted, differed, and the key was replaced by its own
    conversion under --overwrite)."""
    from fixtures_redis import ACL_PASSWORD, ACL_USER, REDIS_PASSWORD

    srv = redis_auth_server
    key = f"same-{secrets.token_hex(4)}"
    tensorstream.serialize({"w": torch.ones(3)}, str(tmp_path / "m.tensors"))
    blob = (tmp_path / "m.tensors").read_bytes()
    src = srv.url(key, password=REDIS_PASSWORD)
    with tensorstream.open(src, "wb") as f:
        f.write(blob)
    for dst in (srv.url(key, user="default", password=REDIS_PASSWORD),
                srv.url(key, user=ACL_USER, password=ACL_PASSWORD), src):
        with pytest.raises(ConfigurationError,
                           match="source and destination are the same") as info:
            tensorstream.convert(src, dst, overwrite=True)
        assert REDIS_PASSWORD not in str(info.value) and ACL_PASSWORD not in str(info.value)
    assert tensorstream.open(src).read() == blob


@pytest.mark.parametrize("metadata", [{"k": "\ud800"}, {"\udc80": "v"}])
def test_metadata_that_is_not_unicode_is_refused_first(tmp_path: Path,
                                                       metadata: dict[str, str]) -> None:
    """A lone surrogate in metadata= was written (JSON escapes it) into a file that neither
    safetensors nor tensorstream loads; tensorstream.safetensors.save refused it already."""
    tensorstream.serialize({"w": torch.ones(2)}, str(tmp_path / "m.tensors"))
    with pytest.raises(ConfigurationError, match="not valid Unicode"):
        tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"),
                             metadata=metadata)
    assert _clean(tmp_path) == ["m.tensors"]


def test_long_hostile_names_make_short_messages(tmp_path: Path) -> None:
    """A tensor name is up to 64 KiB and a metadata key up to the 100 MB header: the errors
    and the note repeated them whole (a 5 MB key made a 5 MB note), where inspect's and the
    loaders' messages cut them (``shown``)."""
    name = "n" * 60_000
    st_torch.save_file({name: torch.ones([1] * 65)}, str(tmp_path / "dims.safetensors"))
    with pytest.raises(UnsupportedDtypeError, match="65 dimensions") as info:
        tensorstream.convert(str(tmp_path / "dims.safetensors"), str(tmp_path / "d.tensors"))
    assert len(str(info.value)) < 500
    for shard in ("a", "b"):
        st_torch.save_file({name: torch.ones(1)}, str(tmp_path / f"{shard}.safetensors"))
    os.unlink(tmp_path / "dims.safetensors")  # the folder: the two shards
    with pytest.raises(MalformedFileError, match="is in both") as info2:
        tensorstream.convert(str(tmp_path) + "/", str(tmp_path / "dup.tensors"))
    assert len(str(info2.value)) < 500
    st_torch.save_file({"w": torch.ones(1)}, str(tmp_path / "meta.safetensors"),
                       metadata={"k" * 1_000_000: "v", "note": "x"})
    result = tensorstream.convert(str(tmp_path / "meta.safetensors"), str(tmp_path / "m.tensors"))
    assert len(result.notes[0]) < 500 and "'note'" in result.notes[0]


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP])
def test_a_filesystem_without_hard_links_still_gets_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """A new local destination is published with link(2) (no-clobber); FAT/exFAT and some
    network mounts have no hard links (EPERM / EOPNOTSUPP), and the whole conversion
    failed at its very end. It falls back to a check and a rename there."""
    want = {"w": torch.randn(4)}
    st_torch.save_file(want, str(tmp_path / "m.safetensors"))

    def no_links(src: Any, dst: Any, *a: Any, **kw: Any) -> None:
        raise OSError(code, os.strerror(code), src, None, dst)

    monkeypatch.setattr(os, "link", no_links)
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert_same(tensorizer_read((tmp_path / "m.tensors").read_bytes()), want)
    tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "back.safetensors"))
    assert_same(st_torch.load_file(str(tmp_path / "back.safetensors")), want)
    with pytest.raises(DestinationExistsError):  # still no clobbering
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert _clean(tmp_path) == ["back.safetensors", "m.safetensors", "m.tensors"]


def test_a_shard_replaced_after_its_header_was_checked(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorstream.conversion import to_tensorizer
    from tensorstream.errors import ObjectChangedError

    src = tmp_path / "m.safetensors"
    st_torch.save_file({"w": torch.ones(4)}, str(src))
    real = to_tensorizer.plan_shards

    def plan_then_replace(*a: Any, **kw: Any) -> Any:
        shards = real(*a, **kw)
        st_torch.save_file({"w": torch.ones(5)}, str(src))  # same name, other shape
        return shards

    monkeypatch.setattr(to_tensorizer, "plan_shards", plan_then_replace)
    with pytest.raises(ObjectChangedError, match="changed while converting"):
        tensorstream.convert(str(src), str(tmp_path / "m.tensors"))
    assert _clean(tmp_path) == ["m.safetensors"]


@pytest.mark.parametrize("where", ["local", "redis"])
def test_a_conversion_out_of_local_room_names_the_file(request: pytest.FixtureRequest,
                                                       tmp_path: Path, where: str) -> None:
    """Out of room while writing (EFBIG past RLIMIT_FSIZE, as ENOSPC on a full disk):
    was a bare "[Errno 28] No space left on device". A local destination is
    named; a remote one is made whole in a local temporary directory first, and
    that file is named with a hint to set TMPDIR. Nothing is published."""
    src = tmp_path / "m.safetensors"
    st_torch.save_file({"w": torch.randn(512, 1024)}, str(src))  # 2 MiB
    (tmp_path / "out").mkdir()
    store = _store(where, request, tmp_path / "out")
    dst = store.uri("m.tensors")
    with file_size_limit(1 << 20), pytest.raises(OSError) as info:
        tensorstream.convert(str(src), dst)
    assert info.value.errno == errno.EFBIG, info.value
    if where == "local":
        assert info.value.filename == dst
        assert os.listdir(tmp_path / "out" / "store") == []
    else:
        assert "TMPDIR" in str(info.value) and str(info.value.filename).endswith("model.tensors")
        assert not os.path.exists(os.path.dirname(str(info.value.filename)))
    assert not store.exists("m.tensors")


def test_a_safetensors_destination_out_of_local_room_names_the_file(tmp_path: Path) -> None:
    """The other direction said only "[Errno 28] No space left on device" (EFBIG here):
    neither the file nor that nothing was published."""
    src = tmp_path / "m.tensors"
    tensorstream.serialize({"w": torch.randn(512, 1024)}, str(src))  # 2 MiB
    (tmp_path / "out").mkdir()
    dst = str(tmp_path / "out" / "m.safetensors")
    with file_size_limit(1 << 20), pytest.raises(OSError) as info:
        tensorstream.convert(str(src), dst)
    assert info.value.errno == errno.EFBIG, info.value
    assert info.value.filename == dst and "nothing was published" in str(info.value)
    assert os.listdir(tmp_path / "out") == []


# -- a damaged tensorizer source: its stored hashes are checked ------------------------------------------


def _damaged(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A tensorizer file whose tensor ``a`` has one byte flipped (its stored hashes kept)."""
    want = {"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(300, dtype=torch.float16)}
    good = tmp_path / "good.tensors"
    st_path = tmp_path / "m.safetensors"
    st_path.write_bytes(st_bytes(want))
    tensorstream.convert(str(st_path), str(good))
    blob = bytearray(good.read_bytes())
    at = blob.find(want["a"].numpy().tobytes())
    assert at > 0
    blob[at + 100] ^= 0x01
    bad = tmp_path / "bad.tensors"
    bad.write_bytes(bytes(blob))
    return bad, want


def test_a_damaged_tensorizer_source_is_refused_unless_verify_hash_is_off(tmp_path: Path) -> None:
    from tensorstream.tensorizer import TensorHashMismatchError

    bad, want = _damaged(tmp_path)
    dst = tmp_path / "out.safetensors"
    for verify in (None, True):  # checked by default
        with pytest.raises(TensorHashMismatchError, match="'a'"):
            tensorstream.convert(str(bad), str(dst), verify_hash=verify)
        assert not dst.exists() and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    # Without the check the damage is converted, as tensorizer loads it by default.
    tensorstream.convert(str(bad), str(dst), verify_hash=False)
    got = st_torch.load_file(str(dst))
    assert not got["a"].equal(want["a"]) and got["b"].equal(want["b"])
    # An undamaged source passes the check, bit for bit.
    good = tmp_path / "good.tensors"
    tensorstream.convert(str(good), str(tmp_path / "ok.safetensors"), verify_hash=True)
    assert_same(st_torch.load_file(str(tmp_path / "ok.safetensors")), want)


def test_verify_hash_on_an_encrypted_source(tmp_path: Path) -> None:
    key = Encryption(key=secrets.token_bytes(32))
    good = tmp_path / "enc.tensors"
    want = {"a": torch.arange(4096, dtype=torch.float32)}
    (tmp_path / "m.safetensors").write_bytes(st_bytes(want))
    tensorstream.convert(str(tmp_path / "m.safetensors"), str(good), encryption=key)
    tensorstream.convert(str(good), str(tmp_path / "ok.safetensors"), encryption=key,
                         verify_hash=True)
    assert_same(st_torch.load_file(str(tmp_path / "ok.safetensors")), want)


@pytest.mark.parametrize("value", ["yes", 1, "false"])
def test_verify_hash_takes_a_bool(tmp_path: Path, value: Any) -> None:
    bad, _ = _damaged(tmp_path)
    with pytest.raises(ConfigurationError, match="verify_hash= takes True or False"):
        tensorstream.convert(str(bad), str(tmp_path / "out.safetensors"), verify_hash=value)


def test_verify_hash_on_a_safetensors_source_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.safetensors").write_bytes(st_bytes({"a": torch.ones(4)}))
    with pytest.raises(ConfigurationError, match="safetensors source has none"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"),
                             verify_hash=True)
    assert not (tmp_path / "m.tensors").exists()
    for verify in (None, False):  # the default, and no check: nothing to check there
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"),
                             verify_hash=verify, overwrite=True)
