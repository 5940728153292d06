"""tqdm progress bars for ``cp``/``sync``, on a terminal only.

One object: one bar named after it. Several: a total bar plus one bar per
large object in flight. Bars count bytes as the engine reports them; when a
destination is read back, its bar is relabelled ``verifying NAME`` and counts
the read-back. A failed object's missing bytes are taken off the total, so
the total ends at 100% of what was copied. Per-object bars disappear when
their object is done (nothing stale stays on screen); only the total stays.
Lines printed meanwhile (``copy: a -> b``) go through :meth:`write`, above
the bars. Names are escaped: a key cannot move the cursor.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from .output import escape_name

__all__ = ["TqdmProgress", "make_progress"]

_PER_FILE_MIN = 8 << 20  # smaller objects only move the total bar


def _short(name: str, width: int = 40) -> str:
    name = escape_name(name)
    return name if len(name) <= width else "..." + name[-(width - 3):]


class TqdmProgress:
    """Implements :class:`tensorstream.copy.engine.ProgressListener` with tqdm."""

    def __init__(self, stream: TextIO) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self._stream = stream
        self._lock = threading.RLock()  # advance() comes from worker threads too
        self._total: Any = None
        self._single = False
        self._files: dict[str, Any] = {}
        self._done: dict[str, int] = {}  # bytes reported per object in flight
        self._sizes: dict[str, int] = {}
        self._free_positions: list[int] = []
        self._next_position = 1

    def _bar(self, **kw: Any) -> Any:
        return self._tqdm(unit="B", unit_scale=True, unit_divisor=1024, file=self._stream,
                          dynamic_ncols=True, mininterval=0.2, **kw)

    def start(self, files: int, total_bytes: int) -> None:
        with self._lock:
            self._single = files == 1
            if not self._single:
                self._total = self._bar(total=total_bytes, desc=f"total ({files} files)",
                                        position=0)

    def file_started(self, name: str, size: int) -> None:
        with self._lock:
            self._done[name] = 0
            self._sizes[name] = size
            if self._single:
                self._total = self._bar(total=size, desc=_short(name), position=0)
                return
            if size < _PER_FILE_MIN:
                return
            pos = self._free_positions.pop() if self._free_positions else self._next_position
            if pos == self._next_position:
                self._next_position += 1
            self._files[name] = self._bar(total=size, desc=_short(name), position=pos,
                                          leave=False)

    def advance(self, name: str, nbytes: int) -> None:
        with self._lock:
            if name in self._done:
                self._done[name] += nbytes
            if self._total is not None:
                self._total.update(nbytes)
            bar = self._files.get(name)
            if bar is not None:
                bar.update(nbytes)

    def phase(self, name: str, what: str) -> None:
        """The engine started reading ``name``'s destination back (``what="verifying"``)."""
        with self._lock:
            size = self._sizes.get(name, 0)
            if self._single:
                if self._total is not None:
                    self._finish(self._total)
                    self._total.close()  # stays on screen: "NAME 100%", then the check
                self._total = self._bar(total=size, desc=f"{what} {_short(name, 30)}",
                                        position=0)
                return
            bar = self._files.get(name)
            if bar is not None:
                self._finish(bar)
                bar.reset(total=size)
                bar.set_description_str(f"{what} {_short(name, 30)}")  # shown at once
            elif self._total is not None:
                self._total.set_postfix_str(f"{what} {_short(name, 30)}")

    def verified(self, name: str, nbytes: int) -> None:
        with self._lock:
            bar = self._total if self._single else self._files.get(name)
            if bar is not None:
                bar.update(nbytes)

    def file_finished(self, name: str, ok: bool) -> None:
        with self._lock:
            got = self._done.pop(name, 0)
            missing = self._sizes.pop(name, 0) - got
            if not ok and missing > 0 and self._total is not None and not self._single:
                # What was not copied never arrives: the total counts what was.
                self._total.total = max(self._total.n, self._total.total - missing)
            if self._total is not None and not self._single:
                self._total.set_postfix_str("", refresh=False)
            bar = self._files.pop(name, None)
            if bar is not None:
                self._free_positions.append(bar.pos if bar.pos > 0 else 1)
                self._finish(bar)
                bar.close()

    @staticmethod
    def _finish(bar: Any) -> None:
        if bar is not None and bar.total and bar.n >= bar.total:
            bar.refresh()  # the last update may have been rate-limited: show 100%

    def write(self, line: str, stream: TextIO) -> None:
        """Print ``line`` above the bars (they are redrawn below it)."""
        with self._lock:
            self._tqdm.write(line, file=stream)

    def close(self) -> None:
        with self._lock:
            for bar in self._files.values():
                bar.close()
            self._files.clear()
            if self._total is not None:
                self._finish(self._total)
                self._total.close()
                self._total = None


def make_progress(enabled: bool, stream: TextIO | None = None) -> TqdmProgress | None:
    """A progress listener when ``enabled`` and ``stream`` (stderr) is a terminal."""
    stream = stream or sys.stderr
    if not enabled or not stream.isatty():
        return None
    return TqdmProgress(stream)
