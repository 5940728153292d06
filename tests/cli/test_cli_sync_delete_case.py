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


def test_dryrun_shows_what_the_run_does_where_case_is_ignored(
        folding_mount: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --dryrun showed A.bin deleted, which the run then kept.
    src, dst = tmp_path / "src", folding_mount / "out"
    _renamed_in_case(src, dst)
    capsys.readouterr()
    assert cli_main(["sync", "--delete", "--dryrun", str(src), str(dst)]) == 0
    captured = capsys.readouterr()
    assert "delete" not in captured.out
    assert f"--delete left {dst}/A.bin alone" in captured.err
    assert sorted(p.name for p in (tmp_path / "mnt" / "out").iterdir()) == ["A.bin"]
    assert sorted(p.name for p in (tmp_path / "back" / "out").iterdir()) == ["A.bin"]


def test_two_files_that_only_python_folds_alike_are_two(
        folding_mount: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 'é' in NFD and in NFC are two names to this filesystem (as to NTFS, FAT, ext4
    # casefold): the NFD file SRC no longer has was kept forever, "the copy of" the NFC one.
    src, dst = tmp_path / "src", folding_mount / "out"
    nfd, nfc = "e\u0301.bin", "\u00e9.bin"
    src.mkdir()
    (src / nfd).write_bytes(b"old")
    assert cli_main(["sync", str(src), str(dst)]) == 0
    (src / nfd).rename(src / nfc)
    assert cli_main(["sync", "--delete", str(src), str(dst)]) == 0
    assert sorted(p.name for p in dst.iterdir()) == [nfc]
    assert (dst / nfc).read_bytes() == b"old"
    assert "ignores case" not in capsys.readouterr().err


def test_a_case_sensitive_dryrun_still_shows_the_delete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _renamed_in_case(src, dst)
    capsys.readouterr()
    assert cli_main(["sync", "--delete", "--dryrun", str(src), str(dst)]) == 0
    captured = capsys.readouterr()
    assert "A.bin" in captured.out and "delete" in captured.out
    assert "ignores case" not in captured.err
    assert sorted(p.name for p in dst.iterdir()) == ["A.bin"]
