"""``sync --delete``'s reach below a local DST where paths run past PATH_MAX.

The copy writes there a directory at a time (by descriptors); the listing looks at each
entry by its whole path, which the system refuses past PATH_MAX (``File name too long``).
What lies there is listed and deleted as the copy writes: one directory descriptor at a
time from DST, symbolic links never followed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

from ..copy.keys import UnsafeKeyError, is_temp_name, open_dir_under

__all__ = ["listed_deep", "too_long", "unlink_deep"]

_TOO_LONG = os.strerror(errno.ENAMETOOLONG)


def too_long(why: str) -> bool:
    """Whether a listing skipped an entry only because its whole path is too long."""
    return why.endswith(_TOO_LONG)


def _descend(root: str, parts: list[str]) -> int:
    """A descriptor of ``root/parts...`` opened a directory at a time, as the copy opens
    it (:func:`~tensorstream.copy.keys.open_dir_under`; links not followed: ``ELOOP``)."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        return open_dir_under(root_fd, parts, create=False)
    except UnsafeKeyError as exc:  # (a link swapped in since the walk: an OSError here)
        raise OSError(errno.ELOOP, str(exc)) from None
    finally:
        os.close(root_fd)


def listed_deep(root: str, key: str) -> Iterator[tuple[str, str]]:
    """``(key, why)`` pairs: ``why`` is "" for a regular file at or under ``key``, else why
    the entry is left (a symbolic link, never followed)."""
    *above, name = key.split("/")
    fd = _descend(root, above)
    try:
        st = os.lstat(name, dir_fd=fd)
        if stat.S_ISREG(st.st_mode):
            yield key, ""
        elif stat.S_ISLNK(st.st_mode):
            yield key, "symbolic link"
        elif stat.S_ISDIR(st.st_mode):
            # A directory the walk could not read is never yielded as a ``top``: it is
            # named, as the shallow listing names one ("cannot read directory"), where it
            # was skipped without a word (and what is under it never looked at).
            failed: list[OSError] = []
            found: set[str] = {name}
            walked: set[str] = set()
            for top, dirs, files, at in os.fwalk(name, dir_fd=fd, follow_symlinks=False,
                                                 onerror=failed.append):
                walked.add(top)
                rel = "/".join([*above, top])
                # (a link to a directory is among dirs, and left out of the walk)
                links = [d for d in dirs if stat.S_ISLNK(os.lstat(d, dir_fd=at).st_mode)]
                found.update(f"{top}/{d}" for d in dirs if d not in links)
                for entry in sorted(files + links):
                    if is_temp_name(entry):
                        continue  # tensorstream's own temp/partial files
                    mode = os.lstat(entry, dir_fd=at).st_mode
                    if stat.S_ISREG(mode):
                        yield f"{rel}/{entry}", ""
                    elif stat.S_ISLNK(mode):
                        yield f"{rel}/{entry}", "symbolic link"
            if failed:
                why = failed[0].strerror or str(failed[0])
                for top in sorted(found - walked):
                    yield "/".join([*above, top]), f"cannot read directory ({why})"
    finally:
        os.close(fd)


def unlink_deep(root: str, key: str) -> None:
    """Delete the file ``root/key`` reached a directory at a time."""
    *above, name = key.split("/")
    fd = _descend(root, above)
    try:
        if not stat.S_ISREG(os.lstat(name, dir_fd=fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", name)
        os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
