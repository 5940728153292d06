"""Reliability: a ``--resume`` journal that makes no sense is ignored (issue 15, class 5).

The journal of an interrupted ``cp`` is a file in the destination directory: anyone can
edit it, a crash can cut it. Part numbers outside the object, negative or non-numeric,
digests that are not sha256 hex, or a journal of the wrong shape must mean "start over",
never a raw Python error or a claim that bytes were copied. A sensible journal is still
used (the baseline below proves the test reaches the journal)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tensorstream.copy.engine import copy
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = [pytest.mark.usefixtures("isolated_env", "http_reset"), pytest.mark.timeout(120)]

PART = 1 << 20
DATA = os.urandom(5 * PART + 77)
SHA0 = hashlib.sha256(DATA[:PART]).hexdigest()


def _seed(http_server: HTTPTestServer, dst: Path, parts: Any) -> str:
    """An interrupted run's leftovers: the partial file (first part right) and a journal."""
    key = "journal-src.bin"
    http_server.put(key, DATA)
    url = http_server.url(key)
    partial = dst.parent / f".{dst.name}.tensorstream-partial.tmp"
    partial.write_bytes(DATA[:PART] + bytes(len(DATA) - PART))
    identity = {"v": 1, "source": url, "size": len(DATA), "etag": http_server.etag(key),
                "part_size": PART}
    journal = dst.parent / f".{dst.name}.tensorstream-journal.tmp"
    journal.write_text(json.dumps({"identity": identity, "parts": parts}))
    return url


def test_a_sensible_journal_is_used(http_server: HTTPTestServer, tmp_path: Path) -> None:
    dst = tmp_path / "m.bin"
    url = _seed(http_server, dst, {"0": SHA0})
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == PART  # the journal was read and its part reused
    assert dst.read_bytes() == DATA
    # ... but that part was compared with the journal only, never with the source
    assert not result.verified and not result.outcomes[0].verified


def test_a_journal_that_lies_consistently_is_never_called_verified(
        http_server: HTTPTestServer, tmp_path: Path) -> None:
    dst = tmp_path / "m.bin"
    forged = bytes(PART)  # zeros where the source has other bytes ...
    url = _seed(http_server, dst, {"0": hashlib.sha256(forged).hexdigest()})
    partial = tmp_path / f".{dst.name}.tensorstream-partial.tmp"
    partial.write_bytes(forged + bytes(len(DATA) - PART))  # ... and a journal agreeing
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.resumed_bytes == PART
    assert not result.verified, "bytes never compared with the source were called verified"


@pytest.mark.parametrize("parts", [
    {"99999999999999999999": SHA0}, {"6": SHA0}, {"-1": SHA0}, {"abc": SHA0}, {"1.5": SHA0},
    {"0": "not-a-digest"}, {"0": 5}, {"0": SHA0.upper()}, {"0": None}, {" 0": SHA0},
    [0, 1], "0", None, {"0": SHA0, "5000000": SHA0},
], ids=repr)
def test_a_journal_that_makes_no_sense_is_ignored(http_server: HTTPTestServer, tmp_path: Path,
                                                  parts: Any) -> None:
    dst = tmp_path / "m.bin"
    url = _seed(http_server, dst, parts)
    result = copy(url, str(dst), part_size=PART, resume=True)
    assert result.ok, result.errors
    assert result.resumed_bytes == 0  # nothing taken from the journal
    assert dst.read_bytes() == DATA
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".m.bin")) == []
