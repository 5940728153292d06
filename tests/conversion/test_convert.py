"""tensorstream.convert: safetensors <-> tensorizer round trips on every backend, byte-exact,
checked by tensorizer's own TensorDeserializer and safetensors' load. Bounded memory, refusals,
usage, local disk and hashes each have a file of their own (test_convert_*.py)."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import assert_same, checkpoint, sharded, st_bytes, tensorizer_read

import tensorstream
from stores import Store, make_store
from tensorstream.errors import UnsupportedOperationError
from tensorstream.tensorizer import Encryption

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


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
    s3 = make_store("s3", request, tmp_path / "store")
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
