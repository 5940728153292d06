"""Keys that are one file on a filesystem that ignores case (``A.bin``, ``a.bin``): the
later is refused by name where the destination folds case, both copied where it does not.

No kernel filesystem that folds case could be made on the machine these tests were written
on (no vfat in its kernel, ext4 and tmpfs without ``casefold``, XFS's ascii-ci removed):
the real one here is a FUSE filesystem that folds case as FAT and NTFS do
(tests/case_folding_fs.py; skipped without fusepy, libfuse 2, /dev/fuse or root), and the
planner's own tests are given the filesystem's answer
(:func:`~tensorstream.copy.case_names.folds_case`)."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from fuse_mounts import fuse_mount
from memory_provider import MemProvider
from tensorstream.copy import plan as plan_module
from tensorstream.copy.case_names import collisions, folds_case
from tensorstream.copy.engine import copy
from tensorstream.copy.keys import is_temp_name

tensorstream.register("memtest", MemProvider, replace=True)


@pytest.fixture
def store() -> Iterator[dict[str, bytes]]:
    MemProvider.store.clear()
    MemProvider.store.update({"b/m/A.bin": b"upper" * 10, "b/m/a.bin": b"lower" * 20,
                              "b/m/X/one.bin": b"1", "b/m/x/ONE.bin": b"22",
                              "b/m/other.bin": b"3"})
    yield MemProvider.store
    MemProvider.store.clear()


def test_a_filesystem_that_tells_case_apart_is_said_so_and_left_clean(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert folds_case(str(tmp_path), ["d", "not-yet", "deeper"]) is False
    assert folds_case(str(tmp_path / "missing"), []) is False
    assert list(tmp_path.rglob("*")) == [tmp_path / "d"]  # the probe file is gone


def test_collisions_pair_each_later_key_with_the_first() -> None:
    nfd = unicodedata.normalize("NFD", "Café.bin")
    targets = [("/r", ["A.bin"]), ("/r", ["b.bin"]), ("/r", ["a.bin"]), ("/s", ["A.BIN"]),
               ("/r", ["X", "f"]), ("/r", ["x", "F"]), ("/r", ["café.bin"]), ("/r", [nfd]),
               ("/r", ["b.bin"])]  # (the same target twice: the planner's own business)
    assert list(collisions(targets)) == [(0, 2), (4, 5), (6, 7)]
    assert list(collisions([("/r", ["a"]), ("/r", ["b"])])) == []


def test_keys_one_in_case_are_both_copied_where_case_is_told_apart(
        store: dict[str, bytes], tmp_path: Path) -> None:
    r = copy("memtest://b/m/", f"{tmp_path}/out/", recursive=True)
    assert r.ok and r.files == 5, r.errors
    assert (tmp_path / "out" / "A.bin").read_bytes() == store["b/m/A.bin"]
    assert (tmp_path / "out" / "a.bin").read_bytes() == store["b/m/a.bin"]


def test_keys_one_in_case_onto_a_filesystem_that_folds_it_are_refused_but_the_first(
        store: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On FAT, exFAT, NTFS, macOS's APFS or an ext4 casefold directory, a.bin replaced
    # A.bin (and x/ONE.bin X/one.bin); both were reported copied, one's bytes lost.
    asked: list[str] = []

    def folding(root: str, parts: list[str], names: tuple[str, str] | None = None) -> bool:
        assert names is not None and names[0] != names[1]
        asked.append("/".join([root, *parts, names[1]]))
        return True

    monkeypatch.setattr(plan_module, "folds_case", folding)
    out = tmp_path / "out"
    r = copy("memtest://b/m/", f"{out}/", recursive=True)
    assert not r.ok and r.files == 3, r.errors
    failed = sorted(o.src for o in r.outcomes if o.status == "failed")
    assert failed == ["memtest://b/m/a.bin", "memtest://b/m/x/ONE.bin"]
    said = " ".join(str(e) for e in r.errors)
    assert f"{out}/a.bin and {out}/A.bin are one file" in said
    assert "ignores case" in said and "memtest://b/m/A.bin is copied" in said
    assert (out / "A.bin").read_bytes() == store["b/m/A.bin"]
    # asked where two fold to one only, of each name that differs
    assert sorted(asked) == [f"{out}/a.bin", f"{out}/x", f"{out}/x/ONE.bin"]


def test_a_dry_run_makes_no_probe_file(store: dict[str, bytes], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def never(root: str, parts: list[str], names: tuple[str, str] | None = None) -> bool:
        raise AssertionError("a dry run writes nothing, not even a probe")

    monkeypatch.setattr(plan_module, "folds_case", never)
    r = copy("memtest://b/m/", f"{tmp_path}/", recursive=True, dryrun=True)
    assert r.ok, r.errors
    assert not [p for p in tmp_path.iterdir() if is_temp_name(p.name)]


@pytest.fixture
def folding_mount(tmp_path: Path) -> Iterator[Path]:
    """A directory that folds case (tests/case_folding_fs.py, a FUSE filesystem)."""
    yield from fuse_mount(tmp_path)


def test_on_a_filesystem_that_folds_case_one_key_is_kept_whole_every_run(
        folding_mount: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "X").mkdir(parents=True)
    (src / "x").mkdir()
    files = {"A.bin": os.urandom(1000), "a.bin": os.urandom(2000), "X/one.bin": b"one",
             "x/ONE.bin": b"ONE!", "x/two.bin": b"two"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert folds_case(str(folding_mount), ["out"]) is True
    out = folding_mount / "out"
    for _run in range(2):  # cp, then sync: the same refusals, nothing replaced
        r = copy(str(src), f"{out}/", recursive=True, skip_unchanged=_run == 1)
        failed = sorted(o.src.rsplit("/src/", 1)[1] for o in r.outcomes
                        if o.status == "failed")
        assert failed == ["a.bin", "x/ONE.bin"], r.errors
        assert (out / "A.bin").read_bytes() == files["A.bin"]
        assert (out / "X" / "one.bin").read_bytes() == files["X/one.bin"]
        assert (out / "x" / "two.bin").read_bytes() == files["x/two.bin"]  # (one folder)


def test_names_only_python_folds_alike_are_two_files_and_both_copied(
        folding_mount: Path, tmp_path: Path) -> None:
    # 'é' in NFC and in NFD are two names to this filesystem (as to NTFS, FAT, ext4
    # without casefold): asked of a probe's ASCII case, the later was refused, never
    # copied, though it replaced nothing.
    src = tmp_path / "src"
    src.mkdir()
    nfc, nfd = "caf\u00e9.bin", "cafe\u0301.bin"
    files = {nfc: b"composed", nfd: b"decomposed", "A.bin": b"upper", "a.bin": b"lower"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert folds_case(str(folding_mount), [], (nfc, nfd)) is False
    assert folds_case(str(folding_mount), [], ("A.bin", "a.bin")) is True
    assert not list((tmp_path / "back").iterdir())  # (the probes are gone)
    out = folding_mount / "out"
    r = copy(str(src), f"{out}/", recursive=True)
    failed = sorted(o.src.rsplit("/src/", 1)[1] for o in r.outcomes if o.status == "failed")
    assert failed == ["a.bin"], r.errors
    assert (out / nfc).read_bytes() == b"composed" and (out / nfd).read_bytes() == b"decomposed"


def test_a_name_too_long_for_the_probe_is_asked_as_its_case(tmp_path: Path) -> None:
    long_a, long_b = "A" * 250, "a" * 250
    assert folds_case(str(tmp_path), [], (long_a, long_b)) is False
    assert folds_case(str(tmp_path), [], ("a\0", "A\0")) is False  # (a NUL: no file)
    assert not list(tmp_path.iterdir())
