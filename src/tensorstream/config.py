"""Typed configuration shared by every provider: timeouts, retries, transfer sizes.

Each value object has ``DEFAULT_*`` constants and is built from the flat
keyword options users pass (``tensorstream.open(uri, timeout_idle=5)``) by
:func:`split_options`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "COMMON_OPTIONS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PART_SIZE",
    "RetryConfig",
    "Timeouts",
    "TransferConfig",
    "split_options",
]

MiB = 1 << 20
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_ATTEMPTS = 5
DEFAULT_BACKOFF_INITIAL = 0.1
DEFAULT_BACKOFF_MAX = 10.0
DEFAULT_PART_SIZE = 2 * MiB
DEFAULT_MIN_PART_SIZE = 1 * MiB
DEFAULT_CONCURRENCY = 32
DEFAULT_READAHEAD = 64 * MiB
DEFAULT_LARGE_READ = 4 * MiB


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """Connect and idle (time-between-bytes) timeouts, in seconds.

    There is deliberately no whole-request timeout: a 10 GiB read may take
    minutes, but no socket may sit silent for longer than ``idle``.
    ``total`` bounds one operation *including retries* when set.
    """

    connect: float = DEFAULT_CONNECT_TIMEOUT
    idle: float = DEFAULT_IDLE_TIMEOUT
    total: float | None = None


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Retry policy: jittered exponential backoff on temporary errors only."""

    attempts: int = DEFAULT_ATTEMPTS
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("retries: attempts must be >= 1")


@dataclasses.dataclass(frozen=True)
class TransferConfig:
    """How large reads are split: part size, concurrency and read-ahead."""

    part_size: int = DEFAULT_PART_SIZE
    min_part_size: int = DEFAULT_MIN_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    readahead: int = DEFAULT_READAHEAD
    large_read: int = DEFAULT_LARGE_READ
    #: Sequential reads on a fast link come from one streamed request per run
    #: of reads (HTTP, S3) instead of a request per part.
    stream_reads: bool = True

    def __post_init__(self) -> None:
        if self.part_size < 1 or self.min_part_size < 1 or self.concurrency < 1:
            raise ConfigurationError("part_size, min_part_size and concurrency must be >= 1")


#: Option names every provider accepts (consumed by the shared layers).
COMMON_OPTIONS = frozenset(
    {
        "timeout_connect",
        "timeout_idle",
        "timeout_total",
        "retries",
        "backoff_initial",
        "backoff_max",
        "part_size",
        "min_part_size",
        "concurrency",
        "readahead",
        "large_read",
        "stream_reads",
    }
)


@dataclasses.dataclass(frozen=True)
class CommonConfig:
    timeouts: Timeouts
    retry: RetryConfig
    transfer: TransferConfig


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, got {value!r}")


def split_options(options: dict[str, Any]) -> tuple[CommonConfig, dict[str, Any]]:
    """Split flat options into the shared config and the provider's own options."""
    opts = dict(options)
    t = Timeouts(
        connect=float(opts.pop("timeout_connect", DEFAULT_CONNECT_TIMEOUT)),
        idle=float(opts.pop("timeout_idle", DEFAULT_IDLE_TIMEOUT)),
        total=(None if (v := opts.pop("timeout_total", None)) is None else float(v)),
    )
    r = RetryConfig(
        attempts=int(opts.pop("retries", DEFAULT_ATTEMPTS)),
        backoff_initial=float(opts.pop("backoff_initial", DEFAULT_BACKOFF_INITIAL)),
        backoff_max=float(opts.pop("backoff_max", DEFAULT_BACKOFF_MAX)),
    )
    x = TransferConfig(
        part_size=int(opts.pop("part_size", DEFAULT_PART_SIZE)),
        min_part_size=int(opts.pop("min_part_size", DEFAULT_MIN_PART_SIZE)),
        concurrency=int(opts.pop("concurrency", DEFAULT_CONCURRENCY)),
        readahead=int(opts.pop("readahead", DEFAULT_READAHEAD)),
        large_read=int(opts.pop("large_read", DEFAULT_LARGE_READ)),
        stream_reads=_flag("stream_reads", opts.pop("stream_reads", True)),
    )
    return CommonConfig(t, r, x), opts
