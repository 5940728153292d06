"""The record of one tensorizer load: its clock, its
:class:`~tensorstream.tensorizer.stats.LoadStats` and its one INFO line on the
``tensorstream.load`` logger (DEBUG lines for the read-path decisions)."""

from __future__ import annotations

import os
import time
from typing import Any

from tensorizer import TensorDeserializer

from .hook import forks, reader_count
from .stats import LoadStats, collect, log

__all__ = ["LoadRecord", "size_of"]


class LoadRecord:
    """The numbers of one load, turned into :class:`LoadStats` and one INFO line."""

    def __init__(self, where: str, stream: Any, started: float, lazy: bool) -> None:
        self.where = where
        self.stream = stream
        self.started = started
        self.lazy = lazy
        self.ended: float | None = None
        self.logged = False
        size = size_of(stream)  # now: an eager load closes a plain file
        self.size = size if isinstance(size, int) else None

    def snapshot(self, deserializer: TensorDeserializer) -> LoadStats:
        end = self.ended if self.ended is not None else time.perf_counter()
        return collect(self.where, self.stream, forks(deserializer), seconds=end - self.started,
                       readers=reader_count(deserializer), tensors=len(deserializer),
                       file_size=self.size)

    def loaded(self, deserializer: TensorDeserializer) -> None:
        """The tensors are in memory (eager load): stop the clock, log the line."""
        self.ended = time.perf_counter()
        self._log(deserializer)

    def finish(self, deserializer: TensorDeserializer) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()
        self._log(deserializer)

    def _log(self, deserializer: TensorDeserializer) -> None:
        if self.logged:
            return
        self.logged = True
        try:
            stats = self.snapshot(deserializer)
        except Exception:  # statistics never fail a load
            log.debug("no statistics for %s", self.where, exc_info=True)
            return
        log.info("%s", stats)
        for i, decision in enumerate(stats.decisions):
            log.debug("%s reader %d: %s", self.where, i, decision)


def size_of(stream: Any) -> int | str:
    """A stream's size in bytes (its ``size``, else its file's), ``"?"`` if neither tells."""
    size = getattr(stream, "size", None)
    if size is None:
        try:
            size = os.fstat(stream.fileno()).st_size
        except (OSError, AttributeError, ValueError):
            return "?"
    return int(size)
