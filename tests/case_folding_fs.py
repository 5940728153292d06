"""A case-insensitive, case-preserving FUSE filesystem over a directory (as FAT, NTFS and
macOS's APFS are), for tests: ``python case_folding_fs.py BACKING MOUNTPOINT`` (needs fusepy,
libfuse 2, /dev/fuse and root; the tests that use it are skipped without them). Each name is
looked up in its directory case-insensitively; a new name keeps its case. With
``--refuse-dates`` it also refuses to set a file's dates (``EPERM``), as some FUSE, 9p and
SMB mounts do."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-not-found,import-untyped]

_STAT = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size",
         "st_uid", "st_ino")
_STATVFS = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")

class CaseFolding(Operations):  # type: ignore[misc]
    """Passthrough to ``root``, every path component matched without regard to case."""

    def __init__(self, root: str, refuse_dates: bool = False) -> None:
        self.root = root
        self.refuse_dates = refuse_dates

    def _real(self, path: str) -> str:
        cur = self.root
        for part in (p for p in path.split("/") if p):
            try:
                names = os.listdir(cur)
            except OSError:
                names = []
            match = next((n for n in names if n.casefold() == part.casefold()), None)
            cur = os.path.join(cur, match if match is not None else part)
        return cur

    def access(self, path: str, mode: int) -> None:
        if not os.access(self._real(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        st = os.lstat(self._real(path))
        return {k: getattr(st, k) for k in _STAT}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._real(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._real(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._real(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._real(old), self._real(new))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._real(path), uid, gid)

    def utimens(self, path: str, times: Any = None) -> None:
        if self.refuse_dates:
            raise FuseOSError(errno.EPERM)
        os.utime(self._real(path), times)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        os.truncate(self._real(path), length)

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._real(path))
        return {k: getattr(st, k) for k in _STATVFS}

    def open(self, path: str, flags: int) -> int:
        return os.open(self._real(path), flags & ~getattr(os, "O_DIRECT", 0))

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        os.fsync(fh)


if __name__ == "__main__":
    FUSE(CaseFolding(sys.argv[1], "--refuse-dates" in sys.argv[3:]), sys.argv[2],
         foreground=True, nothreads=True)
