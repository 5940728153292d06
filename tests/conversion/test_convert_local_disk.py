"""tensorstream.convert onto local disk: fsync unless durable=False, a filesystem without hard
links, out of room (the file named, nothing published)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from convert_checkpoints import assert_same, names_in, tensorizer_read

import tensorstream
from reliability_helpers import file_size_limit
from stores import make_store
from tensorstream.conversion import DestinationExistsError

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")


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
    assert names_in(tmp_path) == ["back.safetensors", "m.safetensors", "m.tensors"]


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
    store = make_store(where, request, tmp_path / "out" / "store")
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
