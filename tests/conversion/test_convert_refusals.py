"""tensorstream.convert refuses what it cannot write before writing anything: a wrong or missing
key, an existing destination, what tensorizer or safetensors cannot hold, truncated or malformed
sources, an interrupted conversion; nothing is left behind."""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import assert_same, names_in, st_bytes, tensorizer_read

import tensorstream
from stores import Store
from tensorstream.conversion import DestinationExistsError, UnsupportedDtypeError
from tensorstream.errors import MalformedFileError
from tensorstream.tensorizer import DecryptionError, Encryption

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


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
    assert names_in(tmp_path) == ["m.safetensors"]


def test_empty_tensor_with_encryption_is_refused(tmp_path: Path) -> None:
    st_torch.save_file({"e": torch.empty(0)}, str(tmp_path / "m.safetensors"))
    key = tmp_path / "k.key"
    with pytest.raises(UnsupportedDtypeError, match="cannot encrypt an empty tensor"):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"),
                             encryption=Encryption(keyfile=str(key)))
    assert names_in(tmp_path) == ["m.safetensors"]  # not even a key file was made


@pytest.mark.parametrize(("name", "shape", "why"), [
    ("", [2], "cannot hold the tensor name ''"),  # wrote a file tensorizer cannot read
    ("n" * 65536, [2], "cannot hold the tensor name"),  # was a bare struct.error
    ("deep", [1] * 63 + [2, 1], "has 65 dimensions"),  # was numpy's bare ValueError
    # FP6 (safetensors reads it, torch has no dtype for it): "unsupported dtype" as if unknown
    ("fp6", [2, 4], "tensor 'fp6' is F6_E2M3, which torch"),
])
def test_what_tensorizer_cannot_hold_is_refused_first(tmp_path: Path, name: str,
                                                      shape: list[int], why: str) -> None:
    dtype, end = ("F6_E2M3", 10) if name == "fp6" else ("F32", 12)  # FP6: 8 in 6 bytes
    body = json.dumps({"ok": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       name: {"dtype": dtype, "shape": shape, "data_offsets": [4, end]}}).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + bytes(end))
    with pytest.raises(UnsupportedDtypeError, match=re.escape(why)):
        tensorstream.convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tensors"))
    assert names_in(tmp_path) == ["m.safetensors"]


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
    assert names_in(tmp_path) == ["m.safetensors"]
    # an index naming no shard: was a bare IndexError
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(UnsupportedDtypeError, match=r"index\.json: the checkpoint holds no"):
        tensorstream.convert(str(tmp_path / "model.safetensors.index.json"),
                             str(tmp_path / "m.tensors"))
    assert names_in(tmp_path) == ["m.safetensors", "model.safetensors.index.json"]


def test_dtype_safetensors_cannot_hold_is_refused(tmp_path: Path) -> None:
    tensorstream.serialize({"ok": torch.ones(2), "z": torch.ones(2, dtype=torch.complex128)},
                           str(tmp_path / "m.tensors"))
    with pytest.raises(UnsupportedDtypeError, match=r"'z' has dtype .*complex128.*safetensors"):
        tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    assert names_in(tmp_path) == ["m.tensors"]


def test_a_tensor_named_like_the_metadata_key_is_refused(tmp_path: Path) -> None:
    # was written as the header's "__metadata__": a file neither safetensors nor we could load
    tensorstream.serialize({"ok": torch.ones(2), "__metadata__": torch.ones(2)},
                           str(tmp_path / "m.tensors"))
    with pytest.raises(UnsupportedDtypeError, match=r"'__metadata__'.*reserves"):
        tensorstream.convert(str(tmp_path / "m.tensors"), str(tmp_path / "m.safetensors"))
    assert names_in(tmp_path) == ["m.tensors"]


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
    assert names_in(tmp_path) == ["m.tensors"]


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
    assert names_in(tmp_path) == ["m.safetensors"]
