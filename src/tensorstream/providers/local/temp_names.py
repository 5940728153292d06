"""Names of the temporary files that local writes publish by rename.

``.NAME.tensorstream-XXXXXXXXXXXX.tmp`` beside the destination (same directory,
same filesystem); listings skip them (:func:`is_temp_name`), and ``cp`` finds a
killed run's by :func:`temp_stem`.
"""

from __future__ import annotations

import hashlib
import os
import secrets

__all__ = ["is_temp_name", "temp_path_for", "temp_stem"]

_TEMP_MARK = ".tensorstream-"


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a temporary file of a local write or a copy."""
    return name.startswith(".") and _TEMP_MARK in name and name.endswith(".tmp")


#: The longest name a file may have (bytes; NAME_MAX on Linux, macOS and Windows).
_NAME_MAX = 255
#: The longest ending a temp file adds to its stem (``0123456789ab.tmp``).
_LONGEST_END = 16


def temp_stem(name: str) -> str:
    """The start of every temp file name of ``name``'s copy: ``.NAME.tensorstream-``,
    or for a name too long for that (225-255 bytes, which the destination takes)
    ``.NAM~<sha256 of the name>.tensorstream-``."""
    stem = f".{name}{_TEMP_MARK}"
    if len(os.fsencode(stem)) + _LONGEST_END <= _NAME_MAX:
        return stem
    mark = f"~{hashlib.sha256(os.fsencode(name)).hexdigest()[:16]}{_TEMP_MARK}"
    room = _NAME_MAX - _LONGEST_END - len(mark) - 1
    head = os.fsencode(name)[:room].decode("utf-8", "ignore")  # whole characters
    while len(os.fsencode(head)) > room:  # surrogate-escaped bytes: one more cut
        head = head[:-1]
    return f".{head}{mark}"


def temp_path_for(path: str) -> str:
    """A unique temporary name next to ``path`` (same directory, same filesystem).
    Short enough for any name ``path`` may have: ``.NAME.tensorstream-XXXX.tmp`` of a
    225-255-byte name was too long, and open(path, "wb"), serialize, convert and
    safetensors.save failed on a name cp takes (:func:`temp_stem`)."""
    d, name = os.path.split(path)
    return os.path.join(d, f"{temp_stem(name)}{secrets.token_hex(6)}.tmp")
