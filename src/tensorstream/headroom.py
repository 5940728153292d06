"""How many bytes a device can still hold: the bound on what a model file may claim.

A tensorizer file's index says how large each tensor is, and a *meta* tensor
(written without data, loaded as zeros) costs no byte of the file: a file of
a few hundred KB can claim terabytes. Loads compare the bytes a file claims
with :func:`available_bytes` before allocating any of them.

The figure is generous on purpose (a real model must never be refused): on
the CPU it is what Linux could hand out without killing anything
(``MemAvailable``: free memory plus reclaimable cache, plus free swap), at
most what the process's memory cgroup leaves (its limit minus its usage, its
page cache counted as free); on CUDA the device's free memory plus what
torch's caching allocator holds unused. ``None`` when it cannot be known
(another OS, another device type): then nothing is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import InsufficientMemoryError

__all__ = ["SMALL_CLAIM", "available_bytes", "check_fits", "cpu_available_bytes",
           "cuda_available_bytes", "read_buffer", "size_text"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Claims below this are not compared with the memory available (a lazy load checks
#: each access: reading /proc and the cgroup for every small tensor would cost more).
SMALL_CLAIM = 64 << 20
#: A cgroup limit at or above this is "no limit" (v1 writes 2**63 rounded to pages).
_NO_LIMIT = 1 << 62


def available_bytes(device: Any) -> int | None:
    """Bytes ``device`` (a ``torch.device``) can still hold, or ``None`` if unknown."""
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        return cpu_available_bytes()
    if kind == "cuda":
        return cuda_available_bytes(device)
    return None


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat(path: Path, *names: str) -> int:
    """The first of ``names`` found in a cgroup ``memory.stat`` (0 if none)."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except OSError:
        return 0
    values = dict(line.split(" ", 1) for line in lines if " " in line)
    for name in names:
        if name in values and values[name].strip().isdigit():
            return int(values[name])
    return 0


def _cgroup_headroom(proc: Path = Path("/proc/self/cgroup"),
                     root: Path = _CGROUP_ROOT) -> int | None:
    """What the memory cgroup (v2 or v1) leaves: limit - usage + page cache."""
    try:
        lines = proc.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    files: tuple[str, str, tuple[str, ...]]
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, files = root, ("memory.max", "memory.current", ("file",))
        elif "memory" in controllers.split(","):
            base = root / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_cache", "cache"))
        else:
            continue
        # Inside a container the process's own cgroup is usually mounted as the root.
        for folder in (base / rel.lstrip("/"), base):
            limit = _read_int(folder / files[0])
            if limit is None or limit >= _NO_LIMIT:
                continue
            usage = _read_int(folder / files[1]) or 0
            cache = _stat(folder / "memory.stat", *files[2])
            return max(0, limit - usage + cache)
    return None


def cpu_available_bytes() -> int | None:
    """``MemAvailable + SwapFree``, at most the memory cgroup's headroom; ``None`` off Linux."""
    try:
        info = _meminfo()
    except (OSError, ValueError):
        return None
    if "MemAvailable" not in info:
        return None
    total = info["MemAvailable"] + info.get("SwapFree", 0)
    with contextlib.suppress(OSError, ValueError):
        room = _cgroup_headroom()
        if room is not None:
            total = min(total, room)
    return total


def cuda_available_bytes(device: Any) -> int | None:
    """Free memory on a CUDA device, plus torch's cached blocks nothing uses."""
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    except (RuntimeError, AssertionError, ValueError):
        return None
    return int(free) + max(0, int(cached))


def size_text(n: int) -> str:
    """``n`` bytes, with GiB from a MiB up."""
    return f"{n} bytes ({n / (1 << 30):.3g} GiB)" if n >= 1 << 20 else f"{n} bytes"


def check_fits(claimed: int, device: Any, limit: int | None, where: str, *, count: int,
               detail: str = "", fewer: str = "filter", hint: str | None = None,
               available: int | None = None) -> None:
    """Raise :class:`~tensorstream.errors.InsufficientMemoryError` naming ``where`` when
    ``count`` tensors to load claim more than ``limit`` bytes (``None``: what
    ``device`` has available now; unknown: nothing is refused). ``detail`` follows
    the claimed size in the message; ``fewer`` names the options that load less;
    ``hint`` replaces the advice (where ``max_tensor_bytes`` is not an option);
    ``available``: the memory figure already measured (``None``: measured now)."""
    given = limit is not None
    if limit is None:
        if claimed < SMALL_CLAIM:  # cannot exhaust memory by itself; the probe costs ~0.2 ms
            return
        limit = available if available is not None else available_bytes(device)
        if limit is None:  # unknown: never refuse on a guess
            return
    if claimed <= limit:
        return
    within = (f"the allowance max_tensor_bytes={limit}" if given
              else f"the {size_text(limit)} {getattr(device, 'type', device)} memory available")
    advice = hint or ("If the file is right and the memory will be there, pass "
                      "max_tensor_bytes= the bytes to allow (e.g. '64GiB'), or load fewer "
                      f"tensors ({fewer})")
    raise InsufficientMemoryError(
        f"{where}: its {count} tensor(s) to load claim {size_text(claimed)}{detail}, more than "
        f"{within}; nothing was allocated. {advice}", claimed=claimed, limit=limit)


#: A read's buffer at least this large is compared with the memory available first.
_CHECKED_BUFFER = 256 << 20


def read_buffer(nbytes: int, where: str | Callable[[], str]) -> bytearray:
    """A zeroed buffer for a read of ``nbytes`` (``where``: the object read, named in
    the error, or a function giving it: only called for the error), or
    :class:`~tensorstream.errors.InsufficientMemoryError`: the size
    comes from a server (a ``Content-Length`` of 10**18 made ``read()`` raise a
    bare ``MemoryError``, or, within what the kernel overcommits, get the process
    killed while filling it)."""
    limit = cpu_available_bytes() if nbytes >= _CHECKED_BUFFER else None
    if limit is None or nbytes <= limit:
        try:
            return bytearray(nbytes)
        except MemoryError:
            limit = cpu_available_bytes()
    room = f"the {size_text(limit)} of memory available" if limit is not None else "the memory"
    if callable(where):
        where = where()
    raise InsufficientMemoryError(
        f"{where}: reading {size_text(nbytes)} at once needs more than {room}; read it in "
        "parts (read(n)) or copy it to a file (tensorstream cp)", claimed=nbytes,
        limit=limit or 0)
