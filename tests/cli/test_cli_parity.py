"""``cp``/``sync`` as an operator coming from ``aws s3 cp/sync``, s5cmd or rclone types them:
the real CLI in a subprocess against local folders (and moto's S3 where it says so)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, s3_env
from fixtures_s3 import S3_BUCKET
from tensorstream.cli.options import unmatchable_rule


def test_a_pattern_written_from_the_current_directory_is_a_usage_error(tmp_path: Path) -> None:
    """``--exclude './cache/*'`` (a path as the shell writes it) matches no key: keys are
    relative to SRC and never start with ``./``. It left nothing out, without a word, and
    ``sync --delete`` deleted the destination's cache/ it was meant to keep (exit 0)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "cache").mkdir(parents=True)
    (src / "cache" / "c.bin").write_bytes(b"c")
    (src / "a.bin").write_bytes(b"a")
    (dst / "cache").mkdir(parents=True)
    (dst / "cache" / "mine.bin").write_bytes(b"mine")
    for argv in (["sync", "--delete", "--exclude", "./cache/*", str(src), str(dst)],
                 ["cp", "-r", "--exclude", "./cache/*", str(src), str(tmp_path / "out")],
                 ["sync", "--exclude", "*", "--include", "./a.bin", str(src), str(tmp_path / "o")],
                 ["rm", "-r", "--exclude", "./cache/*", str(src)]):
        r = cli(*argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert "matches no key" in r.stderr
        assert "write 'cache/*'" in r.stderr or "write 'a.bin'" in r.stderr
        assert "Traceback" not in r.stderr
    assert (dst / "cache" / "mine.bin").read_bytes() == b"mine"
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
    assert (src / "cache" / "c.bin").read_bytes() == b"c"
    # what the message says to write leaves cache/ out, and --delete keeps dst's cache/
    r = cli("sync", "--delete", "--exclude", "cache/*", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    assert (dst / "cache" / "mine.bin").read_bytes() == b"mine"
    assert (dst / "a.bin").read_bytes() == b"a" and not (dst / "cache" / "c.bin").exists()


@pytest.mark.parametrize("pattern", ["./x", "../x", "a/./b", "a/../b", "a//b", ".", "..",
                                     "*/./*", "./*"])
def test_patterns_with_dot_or_empty_segments_can_match_no_key(pattern: str) -> None:
    """A copied key has no ``.``, ``..`` or empty segment (such keys are refused), so a
    pattern holding one can only ever match nothing."""
    assert unmatchable_rule([("exclude", pattern)], "SRC") is not None


@pytest.mark.parametrize("pattern", [".*", "*.", ".hidden", "..foo", "a..b", "a/.cfg",
                                     "*/..x/*", "a.b/c", "*", "?", "**/x", "[.]x"])
def test_patterns_of_names_with_dots_are_taken(pattern: str) -> None:
    """The neighbours: dots inside a name (hidden files, suffixes) are ordinary."""
    assert unmatchable_rule([("exclude", pattern)], "SRC") is None


def test_an_include_before_any_exclude_is_a_usage_error_saying_what_to_write(
        tmp_path: Path) -> None:
    """As aws applies them, everything is included to begin with and the last matching rule
    wins: an ``--include`` before any ``--exclude`` changes nothing. s5cmd and rclone take
    ``--include '*.pt'`` as "only these": ``rm -r --include '*.pt'`` deleted every object,
    ``sync --delete --include '*.bin'`` every other file at DST, ``cp -r`` copied all."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    (src / "b.txt").write_bytes(b"b")
    dst.mkdir()
    (dst / "mine.txt").write_bytes(b"mine")
    for argv in (["rm", "-r", "--include", "*.bin", str(src)],
                 ["sync", "--delete", "--include", "*.bin", str(src), str(dst)],
                 ["cp", "-r", "--include", "*.bin", str(src), str(tmp_path / "out")],
                 # rclone's order (first match wins): aws's takes nothing
                 ["cp", "-r", "--include", "*.bin", "--exclude", "*", str(src),
                  str(tmp_path / "out")]):
        r = cli(*argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert r.stderr.startswith("tensorstream: error: --include '*.bin' before any "
                                   "--exclude changes nothing"), r.stderr
        assert "--exclude '*' --include '*.bin'" in r.stderr
    assert sorted(p.name for p in src.iterdir()) == ["a.bin", "b.txt"]
    assert (dst / "mine.txt").read_bytes() == b"mine" and not (dst / "a.bin").exists()
    assert not (tmp_path / "out").exists()
    # what it says to write takes only the .bin; --delete leaves DST's other files
    r = cli("sync", "--delete", "--exclude", "*", "--include", "*.bin", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["a.bin", "mine.txt"]
    # an --include after an --exclude is taken, whatever comes before or after
    r = cli("cp", "-r", "--dryrun", "--exclude", "*.txt", "--include", "b*", "--exclude", "a*",
            str(src), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"(dryrun) copy: {src / 'b.txt'} -> {tmp_path / 'out' / 'b.txt'}"]


def test_cp_r_of_a_folder_that_holds_only_its_marker_copies_no_file(tmp_path: Path,
                                                                   moto_s3: Any) -> None:
    """An empty folder made in the S3 console is its marker ``dir/`` alone. ``cp -r
    s3://b/dir/ out/`` (and ``sync``) copied that marker as an empty file ``out/dir`` (to S3:
    an object ``dir`` beside the prefix) and exited 0; aws s3 cp/sync copy no object from it.
    Now it is said as for a prefix with nothing under it, and nothing is written."""
    env = s3_env(moto_s3, tmp_path)
    s3 = ("--endpoint-url", moto_s3.endpoint_url)
    top = f"parity-{secrets.token_hex(4)}"
    moto_s3.put(S3_BUCKET, f"{top}/empty/", b"")
    moto_s3.put(S3_BUCKET, f"{top}/full/", b"")
    moto_s3.put(S3_BUCKET, f"{top}/full/x.bin", b"x")
    src = f"s3://{S3_BUCKET}/{top}/empty/"
    for argv in (["cp", "-r", src, str(tmp_path / "out") + "/"],
                 ["sync", src, str(tmp_path / "out")],
                 ["cp", "-r", src, f"s3://{S3_BUCKET}/{top}/copy/"]):
        r = cli(*s3, *argv, env=env)
        assert r.returncode == 1, (argv, r.stdout, r.stderr)
        assert f"nothing to copy at {src} (an empty folder: only its marker" in r.stderr
        assert "copy: " not in r.stdout
    # without -r: the marker named as one object (aws s3 cp and s5cmd fail it too)
    for dst in (str(tmp_path / "out") + "/", str(tmp_path / "out" / "named")):
        r = cli(*s3, "cp", src, dst, env=env)
        assert r.returncode == 1, (dst, r.stdout, r.stderr)
        assert f"{src} is a folder marker (an empty folder), not an object" in r.stderr
    assert not (tmp_path / "out").exists()
    assert not moto_s3.exists(S3_BUCKET, f"{top}/copy/empty")
    assert not moto_s3.exists(S3_BUCKET, f"{top}/copy")
    # the neighbours: a folder with objects under its marker, and one object by its name
    r = cli(*s3, "sync", f"s3://{S3_BUCKET}/{top}/full/", str(tmp_path / "f"), env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["x.bin"]
    r = cli(*s3, "cp", "-r", f"s3://{S3_BUCKET}/{top}/full/x.bin", str(tmp_path / "g") + "/",
            env=env)
    assert r.returncode == 0 and (tmp_path / "g" / "x.bin").read_bytes() == b"x", r.stderr
    r = cli(*s3, "cp", f"s3://{S3_BUCKET}/{top}/full/", str(tmp_path / "h") + "/", env=env)
    assert r.returncode == 1 and "is a prefix, not an object; add -r" in r.stderr, r.stderr


def test_a_quoted_local_wildcard_says_the_shell_expands_local_paths(tmp_path: Path) -> None:
    """``cp 'dir/*.bin' DST`` (s5cmd matches local wildcards itself) said only ``no such
    file``: it now says local paths are not matched here and what to write instead."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.bin").write_bytes(b"a")
    for argv in (["cp", str(tmp_path / "d" / "*.bin"), str(tmp_path / "out") + "/"],
                 ["cp", "-r", str(tmp_path / "d" / "?.bin"), str(tmp_path / "out") + "/"],
                 ["sync", str(tmp_path / "d" / "*"), str(tmp_path / "out")]):
        r = cli(*argv)
        assert r.returncode == 1, r.stderr
        assert "local paths are not wildcard-matched" in r.stderr, r.stderr
        assert "--exclude '*' --include" in r.stderr
    assert not (tmp_path / "out").exists()
    # a local file whose name really holds '*' is copied by its name
    (tmp_path / "d" / "x*.bin").write_bytes(b"x")
    r = cli("cp", str(tmp_path / "d" / "x*.bin"), str(tmp_path / "out") + "/")
    assert r.returncode == 0 and (tmp_path / "out" / "x*.bin").read_bytes() == b"x", r.stderr
    # a missing plain path keeps its plain error
    r = cli("cp", str(tmp_path / "d" / "nope.bin"), str(tmp_path / "out") + "/")
    assert r.returncode == 1 and "wildcard-matched" not in r.stderr, r.stderr


def test_a_pattern_matches_a_name_written_in_the_other_unicode_form(tmp_path: Path) -> None:
    """A name made on macOS (HFS+: ``café`` as ``e`` + a combining accent, NFD) and a pattern
    typed elsewhere (``é`` as one character, NFC) look the same and never matched:
    ``--exclude 'café*'`` left the file in, without a word. Names are compared in one form
    now; each copy keeps its own name's bytes."""
    import unicodedata

    nfd, nfc = (unicodedata.normalize(form, "café.bin") for form in ("NFD", "NFC"))
    assert nfd != nfc
    src = tmp_path / "src"
    src.mkdir()
    (src / nfd).write_bytes(b"d")
    (src / "other.bin").write_bytes(b"o")
    for pattern in ("café*", unicodedata.normalize("NFD", "café*")):
        for form in ("NFC", "NFD"):
            r = cli("cp", "-r", "--dryrun", "--exclude", unicodedata.normalize(form, pattern),
                    str(src), str(tmp_path / "out"))
            assert r.returncode == 0, r.stderr
            assert r.stdout.splitlines() == [
                f"(dryrun) copy: {src / 'other.bin'} -> {tmp_path / 'out' / 'other.bin'}"]
    r = cli("cp", "-r", "--exclude", "*", "--include", nfc, str(src), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path / "out") == [nfd]  # the name as the source wrote it
