"""A local file's version: what ``stat`` reports of it, and whether it changed.

The ETag of a local file (:func:`_etag`) is built of what a rewrite cannot put
back; :func:`version_change` says why a file open for reading is no longer the
version a read was pinned to (:class:`~tensorstream.errors.ObjectChangedError`).
"""

from __future__ import annotations

import os
import stat as stat_mod
import zlib
from datetime import datetime, timezone

from ...errors import ObjectChangedError
from ..base import ObjectInfo

__all__ = ["check_version", "object_info", "version_change"]


def _etag(st: os.stat_result) -> str:
    """A file's version: mtime, size, inode, change time, a print of its mode and
    owner, and its link count.

    mtime alone is not enough: ``rsync -t``, ``cp -p`` and ``tar -x`` rewrite a
    file in place and then put its old mtime back (``utime``). The change time
    (``ctime``) and the inode cannot be set by a user, so a rewrite shows there.
    """
    return (f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}-{st.st_ctime_ns:x}"
            f"-{_owner_print(st):x}-{st.st_nlink:x}")


def _owner_print(st: os.stat_result) -> int:
    return zlib.crc32(f"{st.st_mode}:{st.st_uid}:{st.st_gid}".encode())


def version_change(st: os.stat_result, etag: str) -> str | None:
    """Why the file whose ``fstat`` is ``st`` is no longer version ``etag``
    (:func:`_etag`'s), or None when it still is.

    The change time also moves on a change of metadata alone. A hard link made
    or removed (the name renamed over or unlinked while the file is open) shows
    in the link count and leaves the bytes alone: not a new version. A change
    of mode or owner is one: ``cp -p`` and ``rsync -pt`` rewrite a file in place,
    then put back its mode and its old mtime, and the bytes read before and
    after cannot be told to be of one version (a chmod mid-load fails the load;
    loading again reads one version). The change time moving alone (chmod to the
    same mode, an xattr or ACL set) cannot be told from such a rewrite either.
    """
    now = _etag(st)
    if now == etag:
        return None
    mine, pinned = now.split("-"), etag.split("-")
    if mine[:3] != pinned[:3] or len(pinned) != len(mine):
        return "its modification time, size or inode changed"
    if mine[4] != pinned[4]:
        return ("its change time, mode or owner moved while its modification time and size "
                "stayed: rewritten in place and its metadata put back (cp -p, rsync -pt), or "
                "chmod/chown while it was read")
    if mine[5] != pinned[5]:
        return None  # (a link made or removed: the same bytes under fewer or more names)
    return ("its change time moved while its modification time and size stayed: rewritten "
            "in place with its old mtime put back, as rsync -t, cp -p and tar -x do")


def object_info(path: str, st: os.stat_result) -> ObjectInfo:
    """What :meth:`LocalProvider.stat` reports of the file ``path`` whose stat is ``st``."""
    return ObjectInfo(
        path=path,
        size=st.st_size,
        etag=_etag(st),
        mtime=datetime.fromtimestamp(st.st_mtime, tz=timezone.utc),
        # Permission bits, for a local copy to take as cp does (``extra["mode"]``).
        extra={"mode": stat_mod.S_IMODE(st.st_mode) & 0o777},
    )


def check_version(fd: int, path: str, etag: str) -> os.stat_result:
    """The ``fstat`` of ``fd``; :class:`ObjectChangedError` if it is no longer version ``etag``."""
    st = os.fstat(fd)
    why = version_change(st, etag)
    if why is not None:
        raise ObjectChangedError(f"file changed while it was being read: {path} ({why}); "
                                 "read it again", service="file")
    return st
