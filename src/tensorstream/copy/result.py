"""What a copy reports: :class:`CopyResult` (its summary, filled in as objects end) and
:class:`ProgressListener` (the events a progress display receives)."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from .select import FileOutcome

__all__ = ["CopyResult", "ProgressListener"]


class ProgressListener(Protocol):
    """Receives progress events (the CLI's tqdm bars implement this).

    Optional methods, called when the listener has them: ``phase(name,
    "verifying")`` when a destination is being read back (then
    ``verified(name, nbytes)`` as it is), and ``file_done(outcome)`` with the
    :class:`FileOutcome` of every object, copied, failed, skipped or
    interrupted. ``advance`` may be called from worker threads, at any time;
    the other methods may be called from worker threads too (objects copied
    by the lane, :mod:`tensorstream.copy.lane`), but never two at once.
    """

    def start(self, files: int, total_bytes: int) -> None: ...
    def file_started(self, name: str, size: int) -> None: ...
    def advance(self, name: str, nbytes: int) -> None: ...
    def file_finished(self, name: str, ok: bool) -> None: ...


@dataclasses.dataclass
class CopyResult:
    """Summary of a copy. ``ok`` is False when any object failed or was refused."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    verified: bool = True
    resumed_bytes: int = 0
    #: Bytes of ``bytes`` that S3 copied itself (server-side): none crossed this machine.
    server_side_bytes: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    #: Things the user should know that are neither errors nor skips.
    notes: list[str] = dataclasses.field(default_factory=list)
    #: One entry per object considered, in the order they finished.
    outcomes: list[FileOutcome] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def gbps(self) -> float:
        """Throughput in GB/s (10^9 bytes per second) of the bytes transferred through
        this machine (not those kept from an earlier run, nor those S3 copied itself)."""
        moved = self.bytes - self.resumed_bytes - self.server_side_bytes
        return moved / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "gbps": round(self.gbps, 6),
            "verified": self.verified,
            "resumed_bytes": self.resumed_bytes,
            "server_side_bytes": self.server_side_bytes,
            "errors": list(self.errors),
            "skipped": list(self.skipped),
        }
