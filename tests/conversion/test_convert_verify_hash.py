"""A damaged tensorizer source: its stored hashes are checked unless verify_hash=False."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import assert_same, st_bytes

import tensorstream
from tensorstream.errors import ConfigurationError
from tensorstream.tensorizer import Encryption

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


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
