"""What one load did: bytes, time, rate, the read path chosen, requests, retries.

:func:`tensorstream.deserialize` and :func:`tensorstream.load_into_module`
log one INFO line per load on the ``tensorstream.load`` logger and expose the
same numbers as a :class:`LoadStats` (``deserializer.stats``,
``result.stats``). The numbers come from what the stream already records
(``StreamReader.read_stats()`` of every reader, the policy layer's request and
retry counters); nothing is measured twice.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

__all__ = ["LoadStats", "log"]

#: One INFO line per load; DEBUG lines for the read-path decisions.
log = logging.getLogger("tensorstream.load")

#: ``StreamReader.read_stats()["phase"]`` -> the read path it stands for.
_PATHS = {
    "stream": "streamed",  # one sequential request per reader, received in place
    "ranged": "ranged",  # concurrent ranged requests with read-ahead
}


@dataclasses.dataclass(frozen=True)
class LoadStats:
    """Statistics of one tensorizer load (all counts summed over its readers).

    ``path`` is the read path: ``"local-file"`` (a plain OS file read by the
    kernel), ``"local"`` (positional reads of a local file through
    tensorstream), ``"streamed"`` (one streamed request per reader, received
    straight into the tensors), ``"ranged"`` (concurrent ranged requests with
    read-ahead; ``connections`` says how wide it went); a load that changed
    path part-way names both (``"streamed+ranged"``). A load shared by a group
    (``group=``) is ``"group"``, with this rank's numbers: ``bytes`` is what
    this rank pulled from storage (its share and the tensor index, by exact
    concurrent ranged reads), ``requests`` the requests it made. ``decisions``
    holds each reader's last read-path decision and its reason.
    """

    uri: str
    #: Bytes received from storage (headers and tensor data).
    bytes: int
    #: From opening the file to the last tensor loaded (eager loads), or to
    #: the moment the stats were taken (lazy loads).
    seconds: float
    path: str
    readers: int
    requests: int
    retries: int
    #: Bytes received straight into tensor memory / copied out of read-ahead buffers.
    direct_bytes: int = 0
    copied_bytes: int = 0
    #: Sequential (streamed) requests opened.
    streams: int = 0
    #: Bytes a resumed request did not have to fetch again after a broken body.
    resumed_bytes: int = 0
    tensors: int = 0
    #: The most concurrent requests any reader had (the read-ahead's width).
    connections: int = 0
    #: Each reader's current mode and the reason the read engine gave for it.
    decisions: tuple[str, ...] = ()

    @property
    def gb_per_s(self) -> float:
        """Decimal GB per second (0 when nothing was timed)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``gb_per_s`` (for JSON logs and benchmarks)."""
        return {**dataclasses.asdict(self), "gb_per_s": round(self.gb_per_s, 3)}

    def __str__(self) -> str:
        return (
            f"loaded {self.uri}: {self.tensors} tensors, {self.bytes / 1e6:.1f} MB in "
            f"{self.seconds:.3f} s ({self.gb_per_s:.2f} GB/s); path={self.path} "
            f"readers={self.readers} requests={self.requests} retries={self.retries}"
        )


def collect(
    uri: str, stream: Any, forks: list[Any], *, seconds: float, readers: int, tensors: int,
    file_size: int | None = None,
) -> LoadStats:
    """Build :class:`LoadStats` from the stream a load read from and its forks.

    ``stream`` is a :class:`~tensorstream.StreamReader`, or a plain OS file
    (the local fast path: no request counters; ``file_size`` bytes read).
    """
    from ..file import StreamReader

    origin = getattr(stream, "origin", None)
    if origin:  # a group load (MemorySource): what this rank pulled from storage
        own = collect(uri, origin[0], list(origin[1:]), seconds=seconds, readers=readers,
                      tensors=tensors, file_size=file_size)
        return dataclasses.replace(own, path="group", decisions=())
    if not isinstance(stream, StreamReader):
        return LoadStats(uri=uri, bytes=int(file_size or 0), seconds=seconds, path="local-file",
                         readers=readers, requests=0, retries=0, tensors=tensors)
    metrics = getattr(getattr(stream, "_provider", None), "metrics", None)
    per_reader = [_read_stats(r) for r in (stream, *forks)]
    if getattr(getattr(stream, "read_hints", None), "inline", False):
        path = "local"
    else:
        seen: list[str] = []
        for st in per_reader:
            name = _PATHS.get(str(st.get("phase")), str(st.get("phase")))
            if int(st.get("streams", 0) or 0) and "streamed" not in seen:
                seen.append("streamed")  # streamed first, even if it then went wide
            if name not in seen and name != "None":
                seen.append(name)
        path = "+".join(seen) or "ranged"
    return LoadStats(
        uri=uri,
        bytes=int(getattr(metrics, "bytes_read", 0)),
        seconds=seconds,
        path=path,
        readers=readers,
        requests=int(getattr(metrics, "requests", 0)),
        retries=int(getattr(metrics, "retries", 0)),
        direct_bytes=sum(int(st.get("direct_bytes", 0) or 0) for st in per_reader),
        copied_bytes=sum(int(st.get("copied_bytes", 0) or 0) for st in per_reader),
        streams=sum(int(st.get("streams", 0) or 0) for st in per_reader),
        resumed_bytes=int(getattr(metrics, "resumed_bytes", 0)),
        tensors=tensors,
        connections=max((int(st.get("peak_active", st.get("active", 0)) or 0)
                         for st in per_reader), default=0),
        decisions=tuple(f"{st.get('phase')}: {st.get('reason')}" for st in per_reader
                        if st.get("reason")),
    )


def _read_stats(reader: Any) -> dict[str, Any]:
    try:
        return dict(reader.read_stats())
    except Exception:  # statistics never fail a load
        log.debug("no read statistics from %r", reader, exc_info=True)
        return {}
