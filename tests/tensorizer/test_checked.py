"""``CheckedSource`` keeps the position of the file it wraps: exact through reads,
seeks and the wrapped file's own methods, without asking an OS file for it on
every read (each ``tell()`` of one is a system call)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from tensorstream.tensorizer.checked import CheckedSource


class _CountingFile(io.BufferedReader):
    """An OS file that counts the times its position is asked for."""

    tells = 0

    def tell(self) -> int:
        type(self).tells += 1
        return super().tell()


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(10_000)
    path = tmp_path / "blob"
    path.write_bytes(data)
    return path, data


def _open(path: Path) -> tuple[CheckedSource, Any]:
    inner = _CountingFile(io.FileIO(path, "r"))
    _CountingFile.tells = 0
    checked = CheckedSource.wrap(inner)
    assert isinstance(checked, CheckedSource)
    return checked, inner


def test_reads_ask_the_file_for_its_position_once(data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    checked, inner = _open(path)
    with checked:
        got = bytearray()
        for n in (8, 120, 1000, 8, 77, 3000):
            if n % 2:
                got += checked.read(n)
            else:
                buf = bytearray(n)
                assert checked.readinto(buf) == n
                got += buf
        assert checked.tell() == len(got) == inner.tell()
        assert bytes(got) == data[: len(got)]
    assert _CountingFile.tells <= 3  # (one to start, plus the two asserted above)


def test_seeks_and_the_wrapped_files_own_reads_keep_the_position_exact(
        data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    checked, _ = _open(path)
    with checked:
        assert checked.read(10) == data[:10]
        assert checked.seek(100, io.SEEK_CUR) == 110
        assert checked.read(5) == data[110:115]
        assert checked.seek(2000) == 2000
        assert checked.tell() == 2000
        # read1 is the wrapped file's (passed through): it moves the position too
        assert checked.read1(50) == data[2000:2050]
        assert checked.tell() == 2050
        assert checked.read(4) == data[2050:2054]
        checked.seek(-4, io.SEEK_END)
        assert checked.read(4) == data[-4:]
        assert checked.tell() == len(data)


def test_a_read_past_the_end_is_refused_and_the_position_stays_known(
        data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    checked, _ = _open(path)
    with checked:
        checked.seek(len(data) - 10)
        with pytest.raises(Exception, match="runs past the end"):
            checked.read(11)
        assert checked.tell() == len(data) - 10
        assert checked.read(10) == data[-10:]
