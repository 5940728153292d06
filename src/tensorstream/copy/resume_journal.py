"""The ``--resume`` journal of a local destination's temp file: the source's identity
(URI, size, ETag, part size) and the sha256 of each part whole in the file, written
atomically beside it. A journal is a file anyone may edit: one that does not fit the
source and the file, or has one entry that makes no sense, is not used."""

from __future__ import annotations

import json
import os
import re
import stat

from .temp_names import discard_leftover

__all__ = ["JOURNAL_VERSION", "load_journal", "valid_parts", "write_journal"]

JOURNAL_VERSION = 1
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def valid_parts(parts: object, size: int, part_size: int) -> dict[int, str]:
    """The journal's completed parts if every entry makes sense, else none.

    A journal is a file anyone may have edited (or a crash may have cut): part
    numbers must be integers naming a part of this object and each digest a
    sha256 in hex. One entry that is not means the journal is ignored
    as a whole and the copy starts over, never a raw Python error."""
    if not isinstance(parts, dict) or part_size < 1 or size < 0:
        return {}
    count = -(-size // part_size)
    out: dict[int, str] = {}
    for key, value in parts.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 12):
            return {}
        index = int(key)
        if index >= count or not (isinstance(value, str) and _SHA256_HEX.match(value)):
            return {}
        out[index] = value
    return out


def load_journal(dir_fd: int, journal: str, tmp: str, identity: dict[str, object], size: int,
                 part_size: int) -> dict[int, str]:
    """The parts ``journal`` says are whole in ``tmp`` (both in ``dir_fd``), or none:
    no journal, one that is not a journal, or one of another source or settings
    (``identity``) or of a file that is not ``tmp`` of ``size`` bytes."""
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}  # a FIFO or device under the journal's name: not a journal
            data = json.loads(f.read(1 << 24))
        st = os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False)
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." nested deep
        return {}
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        # A second name for the file (a hard link planted beside a journal that
        # fits): resuming would write the source into a file outside the
        # destination. Only the name is removed when starting over.
        return {}
    if not isinstance(data, dict) or data.get("identity") != identity:
        return {}  # the source changed (or other settings): start over
    if st.st_size != size:
        return {}
    return valid_parts(data.get("parts"), size, part_size)


def write_journal(dir_fd: int, journal: str, identity: dict[str, object],
                  parts: dict[str, str]) -> None:
    """Replace ``journal`` in ``dir_fd`` atomically (a new file, fsynced, renamed over it)."""
    body = json.dumps({"identity": identity, "parts": parts})
    new = journal[: -len(".tmp")] + ".new.tmp"
    discard_leftover(dir_fd, new)  # a fresh file: never a FIFO (or link) left there
    jfd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                  | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=dir_fd)
    with os.fdopen(jfd, "wb") as f:
        f.write(body.encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(new, journal, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
