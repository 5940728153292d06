"""Local-disk provider: conformance plus local-only behaviour."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.testing.conformance import ConformanceTarget, ProviderConformance


class TestLocalConformance(ProviderConformance):
    @pytest.fixture
    def target(self, tmp_path: Path) -> ConformanceTarget:
        def put(key: str, data: bytes) -> None:
            p = tmp_path / key
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

        def uri(key: str) -> str:
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            return str(tmp_path / key)

        return ConformanceTarget(uri=uri, put=put)


def test_file_uri_and_bare_path_agree(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"hello world")
    with tensorstream.open(f"file://{p}") as a, tensorstream.open(str(p)) as b:
        assert a.read() == b.read() == b"hello world"


def test_truncated_file_mid_read_never_zero_fills(tmp_path: Path) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(os.urandom(1 << 20))
    with tensorstream.open(p, retries=1) as f:
        os.truncate(p, 1000)
        with pytest.raises((errors.ObjectChangedError, errors.InvalidRangeError)):
            f.read()


def test_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), tensorstream.open(dst, "wb") as w:
        w.write(b"x" * 100)
        raise RuntimeError("fail")
    assert list(tmp_path.iterdir()) == []


def test_dropped_writer_is_not_published(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    w = tensorstream.open(dst, "wb")
    w.write(b"partial")
    del w
    import gc

    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_written_file_gets_normal_permissions(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    with tensorstream.open(dst, "wb") as w:
        w.write(b"abc")
    umask = os.umask(0)
    os.umask(umask)
    assert (dst.stat().st_mode & 0o777) == (0o666 & ~umask)
