"""tqdm progress bars for ``cp``: a total bar plus one bar per large file in flight.

Bars go to stderr and only when it is a terminal (and not ``--quiet``); names
shown are already redacted by the copy engine.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["TqdmProgress", "make_progress"]

_PER_FILE_MIN = 8 << 20  # smaller files only move the total bar


class TqdmProgress:
    """Implements :class:`tensorstream.copy.engine.ProgressListener` with tqdm."""

    def __init__(self, stream: TextIO) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self._stream = stream
        self._total: Any = None
        self._files: dict[str, Any] = {}
        self._free_positions: list[int] = []
        self._next_position = 1

    def _bar(self, **kw: Any) -> Any:
        return self._tqdm(unit="B", unit_scale=True, unit_divisor=1024, file=self._stream,
                          dynamic_ncols=True, miniters=1, **kw)

    def start(self, files: int, total_bytes: int) -> None:
        self._total = self._bar(total=total_bytes, desc=f"total ({files} files)", position=0)

    def file_started(self, name: str, size: int) -> None:
        if size < _PER_FILE_MIN:
            return
        pos = self._free_positions.pop() if self._free_positions else self._next_position
        if pos == self._next_position:
            self._next_position += 1
        short = name if len(name) <= 40 else "..." + name[-37:]
        self._files[name] = self._bar(total=size, desc=short, position=pos, leave=False)

    def advance(self, name: str, nbytes: int) -> None:
        if self._total is not None:
            self._total.update(nbytes)
        bar = self._files.get(name)
        if bar is not None:
            bar.update(nbytes)

    def file_finished(self, name: str, ok: bool) -> None:
        bar = self._files.pop(name, None)
        if bar is not None:
            self._free_positions.append(bar.pos if bar.pos > 0 else 1)
            bar.close()

    def close(self) -> None:
        for bar in self._files.values():
            bar.close()
        self._files.clear()
        if self._total is not None:
            self._total.close()


def make_progress(quiet: bool, stream: TextIO | None = None) -> TqdmProgress | None:
    """A progress listener when ``stream`` (stderr) is a terminal and not quiet."""
    stream = stream or sys.stderr
    if quiet or not stream.isatty():
        return None
    return TqdmProgress(stream)
