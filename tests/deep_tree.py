"""Directory trees deeper than Python's recursion limit, made and removed one level
at a time (``os.makedirs`` and ``shutil.rmtree`` recurse per level: pytest's own
clean-up of such a tree would fail with RecursionError)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

#: Deeper than the recursion limit, within PATH_MAX at "d/" per level.
DEPTH = sys.getrecursionlimit() + 200


def remove_tree(top: Path) -> None:
    """Remove ``top`` and everything under it without recursion."""
    pending, seen = [str(top)], []
    while pending:
        directory = pending.pop()
        seen.append(directory)
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    os.unlink(entry.path)
    for directory in reversed(seen):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(directory)


@contextlib.contextmanager
def deep_tree(base: Path, depth: int = DEPTH) -> Iterator[Path]:
    """``base/d/d/.../d`` (``depth`` levels) holding ``bottom.bin``; yields the
    deepest directory and removes all of ``base`` afterwards."""
    leaf = base
    leaf.mkdir(exist_ok=True)
    try:
        for _ in range(depth):
            leaf = leaf / "d"
            os.mkdir(leaf)
        (leaf / "bottom.bin").write_bytes(b"deep")
        yield leaf
    finally:
        remove_tree(base)
