"""The one place where a local ``OSError`` becomes a tensorstream error."""

from __future__ import annotations

import errno

from ...errors import NotFoundError, PermissionDeniedError, TensorstreamError
from ...uri import windows_path_hint

__all__ = ["map_local_error"]


def map_local_error(exc: OSError, path: str) -> TensorstreamError | OSError:
    """The tensorstream error of ``exc`` (raised for ``path``), or ``exc`` itself."""
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return NotFoundError(f"no such file: {path}{windows_path_hint(path)}", service="file")
    if isinstance(exc, PermissionError):
        return PermissionDeniedError(f"permission denied: {path}", service="file")
    if exc.errno == errno.EISDIR or isinstance(exc, IsADirectoryError):
        return NotFoundError(f"is a directory, not an object: {path}", service="file")
    if exc.errno in _NAMES_NO_FILE:
        # A path no file can have (a shard name from an index: "s.safetensors/x", 300
        # characters, a symlink loop) was a bare OSError, not a tensorstream error.
        return NotFoundError(f"no such file ({_NAMES_NO_FILE[exc.errno]}): {path}",
                             service="file")
    return exc


#: errnos of a path that names no file, and what each means.
_NAMES_NO_FILE = {errno.ENOTDIR: "a part of the path is not a directory",
                  errno.ENAMETOOLONG: "the name is too long",
                  errno.ELOOP: "too many levels of symbolic links"}
