"""Writing a local destination: a temporary file beside it, published whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from .._umask import new_file_mode
from ..providers.local.provider import fsync_path, temp_path_for
from .errors import DestinationExistsError

__all__ = ["local_target"]


@contextlib.contextmanager
def local_target(path: str, overwrite: bool, durable: bool = True) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it becomes ``path`` (0666 less the
    umask, as every local write;
    on disk before it is renamed when ``durable``), on any failure (Ctrl-C included) it is
    removed."""
    tmp = temp_path_for(path)
    try:
        yield tmp
        os.chmod(tmp, new_file_mode())
        if durable:
            fsync_path(tmp)
        if overwrite:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
        if durable:
            fsync_path(os.path.dirname(path) or ".", directory=True)
    finally:
        # (a name never created is not unlinked: on a read-only filesystem that
        # failed too, EROFS, and took the place of the error being raised)
        if os.path.lexists(tmp):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


#: link(2) on a filesystem without hard links (FAT, exFAT, some network mounts).
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _publish_new(tmp: str, path: str) -> None:
    """``tmp`` becomes ``path``, which must not exist: link(2) fails if the name exists
    (no-clobber without a race). Where the filesystem has no hard links, a check and a
    rename (the window between them is the only race left)."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        if not os.path.lexists(path):
            os.replace(tmp, path)
            return
    raise DestinationExistsError(
        f"{path} appeared while converting; pass --overwrite (overwrite=True) to replace it")
