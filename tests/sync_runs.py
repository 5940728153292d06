"""A ``sync`` run as the sync tests read it (each object's outcome by name), and a
folder of local files for one to copy from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensorstream.copy.engine import copy


def sync(src: str, dst: str, options: dict[str, Any]) -> dict[str, str]:
    """``cp -r --skip-unchanged`` (what ``sync`` runs) of ``src`` to ``dst``, which must
    succeed: each object's outcome (``copied``, ``skipped``) by its name."""
    r = copy(src, dst, recursive=True, skip_unchanged=True, **options)
    assert r.ok, r.errors
    return {o.src.rsplit("/", 1)[-1]: o.status for o in r.outcomes}


def local_folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """``tmp_path/src`` holding ``files`` (name -> bytes)."""
    src = tmp_path / "src"
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    return src
