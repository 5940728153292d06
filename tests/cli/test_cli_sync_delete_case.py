"""``sync --delete`` into a local directory whose filesystem ignores case: a file of DST
that is SRC's in other case (``A.bin`` at DST, SRC's renamed ``a.bin``) is the file the
copy just wrote, and is kept. The filesystem that folds case is a FUSE one
(tests/case_folding_fs.py; skipped without fusepy, libfuse 2, /dev/fuse or root)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fuse_mounts import fuse_mount
from tensorstream.cli.main import main as cli_main


@pytest.fixture
def folding_mount(tmp_path: Path) -> Iterator[Path]:
    yield from fuse_mount(tmp_path)


def _renamed_in_case(src: Path, dst: Path) -> None:
    """A sync of ``A.bin``, then the file renamed ``a.bin`` (and rewritten) at SRC."""
    src.mkdir()
    (src / "A.bin").write_bytes(b"old")
    assert cli_main(["sync", str(src), str(dst)]) == 0
    (src / "A.bin").rename(src / "a.bin")
    (src / "a.bin").write_bytes(b"newer bytes")


def test_a_file_in_other_case_than_srcs_is_kept_where_case_is_ignored(
        folding_mount: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It was deleted after the copy wrote a.bin into it: DST ended empty, exit 0.
    src, dst = tmp_path / "src", folding_mount / "out"
    _renamed_in_case(src, dst)
    for _run in range(2):
        assert cli_main(["sync", "--delete", str(src), str(dst)]) == 0
        assert (dst / "a.bin").read_bytes() == b"newer bytes"
    err = capsys.readouterr().err
    assert f"--delete left {dst}/A.bin alone: on this filesystem, which ignores case, it " \
           "is the copy of a.bin" in err


def test_where_case_is_told_apart_the_old_name_is_deleted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _renamed_in_case(src, dst)
    assert cli_main(["sync", "--delete", str(src), str(dst)]) == 0
    assert sorted(p.name for p in dst.iterdir()) == ["a.bin"]
    assert "ignores case" not in capsys.readouterr().err
