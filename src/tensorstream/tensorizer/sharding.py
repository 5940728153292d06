"""Sharded (tensor-parallel) models: one file per rank, named by a template.

vLLM's convention: ``s3://bucket/model-rank-%03d.tensors`` is formatted with
the rank of the process (``model-rank-000.tensors``, ``-001``, ...).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError, DistributedLoadError, NotFoundError
from ..uri import redact

__all__ = ["check_template", "extra_shard", "is_sharded", "missing_shard", "not_a_template",
           "refuse_unloaded_shards",
           "refuse_other_templates", "resolve_rank", "shard_uri", "template_print",
           "warn_stale_shards", "warn_unloaded_in_group"]

log = logging.getLogger("tensorstream.load")

# A zero-padded printf integer, as vLLM detects it ("%03d", "%04d"), or an escaped '%'
# ("%%", printf's, as vLLM's ``uri % rank`` reads it): "%%03d" is the text "%03d", no template.
_TOKEN = re.compile(r"%%|%0(\d+)d")
#: A placeholder that is not a template tensorstream fills: printf's ("%d", "%s", "%3d",
#: "%05i") or str.format's ("{rank}", "{}", "{rank:03d}").
_OTHER_PLACEHOLDER = re.compile(r"(?<!%)(?:%%)*(%[-+ #]?\d*[dis])|(\{\w*(?::[^{}]*)?\})")
#: The widest template filled in: "%0999999999d" made a name of a billion digits (1 GB).
MAX_TEMPLATE_WIDTH = 32


def _templates(uri: str) -> list[re.Match[str]]:
    return [m for m in _TOKEN.finditer(uri) if m.group(1) is not None]


def is_sharded(uri: str) -> bool:
    """True when ``uri`` holds a rank template such as ``%03d``."""
    return isinstance(uri, str) and bool(_templates(uri))


def _distributed() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _launched() -> tuple[str, str] | None:
    """``(RANK, WORLD_SIZE)`` a launcher (torchrun) set for several processes, else None."""
    size = os.environ.get("WORLD_SIZE", "").strip()
    if not size.isdigit() or int(size) <= 1:
        return None
    return os.environ.get("RANK", "?").strip()[:20], size[:20]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` from the arguments, else ``torch.distributed``, else (0, 1).

    Without ``rank`` and without an initialised ``torch.distributed``, a
    ``world_size`` above 1, or a launcher's ``WORLD_SIZE`` above 1 (torchrun
    before ``init_process_group``), is a :class:`ConfigurationError`: every
    process would take rank 0.
    """
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            # a float rank was truncated into another rank's file name; "1" was a bare TypeError
            raise ConfigurationError(f"{name} must be an integer, got {type(value).__name__} "
                                     f"{value!r}")
    dist = _distributed()
    if rank is None and dist is None:
        launched = _launched()
        if launched is not None or (world_size is not None and world_size > 1):
            # rank 0 was taken: under torchrun before init_process_group every process
            # read rank 0's file (same shapes: nothing noticed) or wrote over it
            why = (f"a launcher started {launched[1]} processes (RANK={launched[0]}, "
                   f"WORLD_SIZE={launched[1]})" if launched is not None
                   else f"world_size is {world_size}")
            raise ConfigurationError(
                f"no rank: {why}, but rank= was not passed and torch.distributed is not "
                "initialised, so every process would take rank 0; pass rank= (and "
                "world_size=), or call torch.distributed.init_process_group() first")
    if rank is None:
        rank = dist[0] if dist else 0
    if world_size is None:
        world_size = dist[1] if dist else max(1, rank + 1)
    if rank < 0 or world_size < 1 or rank >= world_size:
        # Which bound was crossed, and the ranks there are: a rank counted from 1 (as a
        # launcher's slot numbers are) is the usual cause.
        raise ConfigurationError(
            f"invalid rank {rank} for world size {world_size}: "
            + ("world_size must be 1 or more" if world_size < 1 else
               f"ranks run from 0 to {world_size - 1} (count ranks from 0, as "
               "torch.distributed does; world_size is the number of ranks)"))
    return rank, world_size


def check_template(uri: str) -> None:
    """Raise :class:`ConfigurationError` if ``uri`` holds more than one rank
    template, or one wider than :data:`MAX_TEMPLATE_WIDTH` digits."""
    found = _templates(uri)
    if len(found) > 1:
        # the second was left in the name: rank 2 of "b/%03d/m-%03d" read "b/002/m-%03d"
        raise ConfigurationError(
            f"{redact(uri)[:200]!r} holds {len(found)} rank templates; use exactly one, "
            "e.g. 'model-rank-%03d.tensors'")
    width = found[0].group(1).lstrip("0") if found else ""
    if len(width) > 2 or (width and int(width) > MAX_TEMPLATE_WIDTH):
        raise ConfigurationError(
            f"the rank template %0{width[:12]}d in {redact(uri)[:200]!r} is wider than "
            f"{MAX_TEMPLATE_WIDTH} digits; use a zero-padded width like %03d")


def _fill(uri: str, rank: int) -> str:
    # printf's reading, as vLLM's: the template gets the rank and "%%" is one '%'
    return _TOKEN.sub(lambda m: m.group(0) % rank if m.group(1) is not None else "%", uri)


def _exists(uri: str, options: Mapping[str, Any]) -> bool | None:
    """Whether an object is at ``uri``; ``None`` when that cannot be told (a store
    that refuses the stat: S3 answers 403 for a missing key without ListBucket)."""
    from ..uri import parse_uri

    parsed = parse_uri(uri)
    if parsed.scheme == "file" and not options:
        return os.path.exists(parsed.path)
    from .. import _loop
    from ..api import stat

    try:
        _loop.run_sync(stat(parsed, **options))
    except FileNotFoundError:
        return False
    except Exception as exc:  # the load itself says what is wrong with the store
        log.debug("could not tell whether %s exists: %s", redact(uri), type(exc).__name__)
        return None
    return True


def _known_world_size(rank: int | None, world_size: int | None) -> int | None:
    """The world size a load or save was given, else ``torch.distributed``'s, else
    1 for a process given no rank; ``None`` when a rank alone gives no count."""
    if world_size is not None:
        return world_size
    dist = _distributed()
    if dist is not None:
        return dist[1]
    return 1 if rank is None else None


def extra_shard(uri: str, rank: int | None, world_size: int | None,
                options: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(URI, world size)`` of the shard of the rank template ``uri`` numbered
    like the world size (past the last rank) when it exists, else ``None``.
    One ``stat``; nothing when the world size is not known (``rank=`` alone)."""
    size = _known_world_size(rank, world_size)
    if size is None:
        return None
    extra = _fill(uri, size)
    return (extra, size) if _exists(extra, options) else None


def warn_stale_shards(uri: str, rank: int | None, world_size: int | None,
                      options: Mapping[str, Any]) -> None:
    """After rank 0 saved its shard of ``uri`` (``rank``/``world_size`` as the save
    was given them): warn when a shard past the last rank is left from an
    earlier save with more ranks (a load refuses it)."""
    if resolve_rank(rank, world_size)[0] != 0:
        return
    found = extra_shard(uri, rank, world_size, options)
    if found is not None:
        log.warning(
            "%s is left from an earlier save with more ranks than these %d: a load of %s "
            "by %d rank(s) is refused while it is there (the model would look like more "
            "shards than ranks); delete it and any shard numbered after it",
            redact(found[0]), found[1], redact(uri), found[1])


def refuse_unloaded_shards(uri: str, rank: int | None, world_size: int | None,
                           options: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigurationError` when the rank template ``uri`` names a
    shard past the last rank: the model has more shards than ranks load, and the
    weights of the shards no rank loads would be missing without a word.

    ``rank``/``world_size`` are what the load was given; the world size is
    that, else ``torch.distributed``'s, else 1 for a process given no rank (a
    rank alone does not say how many ranks there are: nothing is checked).
    One ``stat`` of the shard numbered ``world_size``.
    """
    found = extra_shard(uri, rank, world_size, options)
    if found is None:
        return
    extra, world_size = found

    def name(r: int) -> str:
        return redact(_fill(uri, r)).rsplit("/", 1)[-1]

    loaded = name(0) if world_size == 1 else f"{name(0)} to {name(world_size - 1)}"
    ranks = "1 rank loads" if world_size == 1 else f"{world_size} ranks load"
    raise ConfigurationError(
        f"{redact(extra)!r} exists, but {ranks} {redact(uri)!r}: the model was saved as "
        f"at least {world_size + 1} shards, and "
        f"only {loaded} would be loaded, the weights of the others lost. Load it with as many "
        "ranks as it has shards (vLLM: tensor_parallel_size; here: world_size=), or delete "
        "shards left by an earlier save with more ranks; to read one shard on its own, give "
        "its file name instead of the template.")


def missing_shard(uri: str, rank: int | None, world_size: int | None,
                  options: Mapping[str, Any], error: BaseException) -> NotFoundError:
    """The :class:`NotFoundError` to raise when this rank's shard of the rank template
    ``uri`` is not there: ``error``'s words, then which rank of how many filled in
    the template and what to do. One ``stat`` of the first shard tells a model
    saved with fewer shards than ranks (or missing this one) from a wrong template."""
    r, size = resolve_rank(rank, world_size)

    def name(n: int) -> str:
        return redact(_fill(uri, n)).rsplit("/", 1)[-1]

    of = f"rank {r} of {size}" if world_size is not None or _distributed() else f"rank {r}"
    first = _exists(_fill(uri, 0), options) if r != 0 else False
    check = (f"check the folder and the name (the template is filled as printf's %0Nd: "
             f"rank 0 reads {name(0)})")
    fewer = ("load it with as many ranks as it has shards (vLLM: tensor_parallel_size; here: "
             f"world_size=), or restore {name(r)}")
    if first:
        advice = (f"{name(0)} exists, so the model has fewer shards than the ranks loading "
                  f"it, or {name(r)} is missing (a save or copy that did not finish): {fewer}")
    elif first is None:  # the store would not say
        advice = f"if the model has fewer shards than the ranks loading it, {fewer}; else {check}"
    else:
        advice = ("no shard of it is there, not even the first: " if r != 0 else "") + check
    other = _OTHER_PLACEHOLDER.search(_TOKEN.sub("", uri))
    if other is not None:  # "b/{rank}/m-%03d": the second was left in the name as it is
        advice += (f"; {(other.group(1) or other.group(2))!r} in it is no rank template "
                   "and was read as it is (only one %0Nd is filled in)")
    said = error.message if isinstance(error, NotFoundError) else str(error)
    found = NotFoundError(f"{said} (the shard of {of}, filled into the rank template "
                          f"{redact(uri)!r}); {advice}")
    if isinstance(error, NotFoundError):  # its service/operation/path lead the message
        found.with_context(service=error.service, operation=error.operation, path=error.path)
    return found


def not_a_template(uri: str, error: BaseException) -> NotFoundError | None:
    """The :class:`NotFoundError` to raise when ``uri``, which holds no rank template
    but another placeholder (``%d``, ``{rank}``), was not found: the name was taken
    as it is, and the error says why and what to write instead. ``None`` otherwise."""
    if not isinstance(error, FileNotFoundError) or not isinstance(uri, str) or is_sharded(uri):
        return None
    other = _OTHER_PLACEHOLDER.search(uri)
    if other is None:
        return None
    token = other.group(1) or other.group(2)
    # printf's %d and %01d write the same digits; {rank:03d} is %03d
    padded = re.fullmatch(r"\{\w*:0(\d+)d\}", token)
    same = ("%01d" if token in ("%d", "%i", "{rank}", "{}") or re.fullmatch(r"\{\w*:d\}", token)
            else f"%0{padded.group(1)}d" if padded else None)
    fix = (f"write {same!r} in place of {token!r}" if same else
           f"write a zero-padded %0Nd in place of {token!r}, e.g. 'model-rank-%03d.tensors'")
    said = error.message if isinstance(error, NotFoundError) else str(error)
    # the advice last: a group's error keeps each rank's message's start and end
    found = NotFoundError(
        f"{said} (only a zero-padded %0Nd in a name is a rank template, filled in with the "
        f"rank as vLLM fills it; {token!r} is not, so the name was read as it is; for one "
        f"file per rank, {fix})")
    if isinstance(error, NotFoundError):
        found.with_context(service=error.service, operation=error.operation, path=error.path)
    return found


def template_print(uri: str) -> int:
    """A 63-bit digest of the rank template ``uri``: its first shard's name, a local
    one as an absolute path (``file:///m/x-%03d``, ``/m/x-%03d`` and, from ``/m``,
    ``x-%03d`` are one template), others as their errors show them (redacted:
    presigned tokens that differ between ranks do not count)."""
    from ..uri import parse_uri

    first = _fill(uri, 0)
    try:
        parsed = parse_uri(first)
        name = f"file:{parsed.path}" if parsed.is_local else redact(first)
    except Exception:  # the load itself refused it already
        name = redact(first)
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def refuse_other_templates(uri: str, rank: int, prints: list[int]) -> None:
    """Raise :class:`DistributedLoadError` (on every rank: each sees the same
    ``prints``, every rank's :func:`template_print`) when the ranks of a group
    loaded different rank templates: each rank's shard came from its own
    template, so one rank's stale configuration loaded a shard of another save (or
    another model) beside the others' without a word."""
    if len(set(prints)) <= 1:
        return
    groups: dict[int, list[int]] = {}
    for r, p in enumerate(prints):
        groups.setdefault(p, []).append(r)
    listed = "; ".join("rank" + ("s " if len(rs) > 1 else " ") + ", ".join(map(str, rs))
                       + (" one" if i == 0 else " another") for i, rs in enumerate(groups.values()))
    raise DistributedLoadError(
        f"the ranks of the {len(prints)}-rank group loaded different rank templates "
        f"({listed}); this rank (rank {rank}) loaded {redact(uri)!r}. Shards "
        "of different templates are shards of different saves or models: pass the same "
        "template on every rank, or group=None where each rank's files differ on purpose; "
        "no rank returns tensors")


def warn_unloaded_in_group(uri: str, loaded: list[tuple[int, int]]) -> None:
    """Warn when the ranks of a group, each loading ``(shard number, world size)``
    of the rank template ``uri``, all name one world size the group can fill, yet
    leave a shard of it to no rank while loading another twice (``rank=`` passed
    alike on two ranks): the group as a whole lacks that shard's weights.

    Ranks filling in the same number are not a mistake in themselves (the
    tensor-parallel rank of two pipeline stages): nothing is said then."""
    sizes = {size for _, size in loaded}
    if len(sizes) != 1:
        return
    size = sizes.pop()
    if len(loaded) < size:
        return
    missing = sorted(set(range(size)) - {number for number, _ in loaded})
    if not missing:
        return
    twice: dict[int, list[int]] = {}
    for r, (number, _) in enumerate(loaded):
        twice.setdefault(number, []).append(r)
    def listed(ranks: list[int]) -> str:
        return ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"

    doubled = "; ".join(
        f"ranks {listed(ranks)} each loaded "
        f"{redact(_fill(uri, number)).rsplit('/', 1)[-1]}"
        for number, ranks in sorted(twice.items()) if len(ranks) > 1)
    names = ", ".join(redact(_fill(uri, n)).rsplit("/", 1)[-1] for n in missing[:5])
    log.warning(
        "%s of the %d-shard model %s loaded by no rank of the %d-rank group (%s): each "
        "rank fills the template with its own rank= (here the same on several ranks); "
        "leave rank= out to take each rank's own, or pass a process group as group=",
        names, size, redact(uri), len(loaded), doubled)


def shard_uri(uri: str, *, rank: int | None = None, world_size: int | None = None) -> str:
    """The URI of this rank's shard.

    A URI with a template is formatted with the rank. Without one, a world
    size above 1 is an error (every rank would read or overwrite the same
    file); pass ``rank``/``world_size`` or initialise ``torch.distributed``.

    >>> shard_uri("s3://b/model-rank-%03d.tensors", rank=2, world_size=4)
    's3://b/model-rank-002.tensors'
    """
    if not isinstance(uri, str):
        return uri
    templated = is_sharded(uri)
    if not templated and rank is None and world_size is None and _distributed() is None:
        return uri
    r, ws = resolve_rank(rank, world_size)
    check_template(uri)
    if templated:
        # printf's reading, as vLLM's: the template gets the rank and "%%" is one '%'
        # ("%%03d" was read as '%' and a template: rank 2 named "%002", not "%03d")
        return _fill(uri, r)
    if ws > 1:
        other = _OTHER_PLACEHOLDER.search(uri)
        hint = (f" ({(other.group(1) or other.group(2))!r} is not one: only a zero-padded "
                "%0Nd is filled in)" if other else "")
        raise ConfigurationError(
            f"world size is {ws} but {redact(uri)!r} has no rank template{hint}; every rank "
            "would use the same file. Put a zero-padded template in the name, e.g. "
            "'model-rank-%03d.tensors', and tensorstream fills in each rank."
        )
    return uri
