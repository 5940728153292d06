"""tensorstream.convert's arguments: usage errors, which URIs name the same object (another
spelling, a secret, Redis credentials), metadata that is not unicode, hostile names kept short."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import assert_same, names_in

import tensorstream
from tensorstream.conversion import UnsupportedDtypeError
from tensorstream.errors import (
    ConfigurationError,
    MalformedFileError,
)

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


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
    assert names_in(tmp_path) == ["m.safetensors"]
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
    assert names_in(tmp_path) == ["linked", "model", "sub"]
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
    assert names_in(tmp_path) == ["m.tensors"]


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
