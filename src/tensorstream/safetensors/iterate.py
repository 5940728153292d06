"""Tensors of safetensors files yielded as they land (:func:`iter_tensors`).

The files are read by :mod:`.reader`'s engine on a few producer threads; a
small queue between them and the consumer bounds the tensors read ahead, and
closing the generator stops every read before it returns.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ..distributed.group import resolve_group
from ..errors import MalformedFileError
from ..uri import ParsedURI
from .arguments import Filter, _check, _needed, _sources, _wanted
from .group_load import _shared
from .header import shown
from .reader import _read_file
from .sources import MAX_CONCURRENT_FILES, Source

__all__ = ["iter_tensors"]

#: Tensors that :func:`iter_tensors` reads ahead of its consumer.
_ITER_AHEAD = 4


_DONE = object()


def iter_tensors(
    uri: str | os.PathLike[str] | ParsedURI,
    device: str | torch.device | int = "cpu",
    *,
    dtype: torch.dtype | None = None,
    filter: Filter = None,
    group: Any = None,
    group_timeout: float | None = None,
    **options: Any,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` as each tensor lands, while the next ones are read.

    Same sources and arguments as :func:`load`, less ``num_readers`` (each
    file is read in order by one reader; a local one's chunks by up to 4
    threads) and ``max_tensor_bytes`` (tensors are allocated as they come,
    not claimed up front). Tensors of one file come in
    file order; the shards of a checkpoint are read concurrently and their
    tensors interleave. At most a few tensors are read ahead of the consumer
    (memory stays bounded); closing the generator early stops the reads.

    With ``group`` (as for :func:`load`) the tensors are yielded once the
    group has exchanged them all (every rank holds the whole set in host
    memory first).

    >>> for name, t in iter_tensors("https://host/model.safetensors"):  # doctest: +SKIP
    ...     model.get_parameter(name).copy_(t)
    """
    shared = resolve_group(group, group_timeout)
    if shared is not None:
        yield from _shared(uri, device, dtype, filter, None, shared, options)
        return
    dev, _ = _check(device, 1, dtype)
    wanted = _wanted(filter)
    sources = _needed(_sources(uri, options, wanted), wanted)
    if not sources:
        return
    ready: queue.Queue[Any] = queue.Queue(maxsize=_ITER_AHEAD)
    stop = threading.Event()
    held_by: dict[str, str] = {}  # tensor name -> the (redacted) file it came from
    lock = threading.Lock()

    def emit(where: str, name: str, t: torch.Tensor) -> None:
        with lock:
            if name in held_by:
                raise MalformedFileError(f"tensor {shown(name)} is in more than one file: "
                                         f"{held_by[name]} and {where}")
            held_by[name] = where
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put((name, t), timeout=0.1)
                return
        raise _Stopped

    def produce(source: Source) -> None:
        try:
            _read_file(source, options, wanted, dev, dtype, 0, functools.partial(emit, source.where),
                       early=dev.type == "cpu", ordered=True)
        except _Stopped:
            return
        except BaseException as exc:
            stop.set()
            _put(exc)
            return
        _put(_DONE)

    def _put(item: Any) -> None:
        while True:  # the consumer drains until every producer reported
            try:
                ready.put(item, timeout=0.1)
                return
            except queue.Full:
                if stop.is_set() and item is _DONE:
                    return

    pool = concurrent.futures.ThreadPoolExecutor(min(MAX_CONCURRENT_FILES, len(sources)),
                                                 thread_name_prefix="tensorstream-safetensors")
    futures = [pool.submit(produce, s) for s in sources]
    done = 0
    try:
        while done < len(sources):
            item = ready.get()
            if item is _DONE:
                done += 1
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while True:  # unblock producers, then wait for them (no read outlives us)
            with contextlib.suppress(queue.Empty):
                while True:
                    ready.get_nowait()
            if all(f.done() for f in futures):
                break
            with contextlib.suppress(concurrent.futures.TimeoutError):
                concurrent.futures.wait(futures, timeout=0.05)
        pool.shutdown(wait=True, cancel_futures=True)


class _Stopped(Exception):
    """The consumer closed the iterator."""
