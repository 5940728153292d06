"""A small tmpfs mounted for one test (a read-only filesystem, a full disk); needs root."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(mnt: Path, options: str, unmountable: str) -> Iterator[Path]:
    """A tmpfs mounted at ``mnt`` (made here) with ``options`` (``-o``) for as long as
    the generator is not closed, unmounted after; the test is skipped with
    ``unmountable`` where it cannot be mounted (not root)."""
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(unmountable)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
