"""Listing local files: the regular files under a prefix, in path order."""

from __future__ import annotations

import os
import stat as stat_mod

from ..base import ObjectInfo
from .temp_names import is_temp_name
from .version import object_info

__all__ = ["list_files"]


def list_files(prefix: str) -> list[ObjectInfo]:
    """The regular files under ``prefix`` (a directory, or a directory and the start
    of names in it), depth first, sorted by path; temporary files are left out."""
    if os.path.isdir(prefix):
        root, name_prefix = prefix, ""
    else:
        root, name_prefix = os.path.split(prefix)
    out: list[ObjectInfo] = []
    if not os.path.isdir(root):
        return out
    # Depth first with a stack of our own (a tree deeper than the recursion limit is
    # listed, not a RecursionError); "dir/na" walks only dir's entries named na*, not
    # all of dir (for "/nonexistent" that was the whole file system).
    pending = [(root, True)]
    while pending:
        directory, top = pending.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[tuple[str, bool]] = []
        for entry in entries:
            if top and not entry.name.startswith(name_prefix):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append((entry.path, False))
                    continue
                if is_temp_name(entry.name):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                out.append(object_info(entry.path, st))
        pending.extend(reversed(subdirs))
    out.sort(key=lambda i: i.path)
    return out
