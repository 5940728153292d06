"""How objects are laid out in Redis keys (no I/O here; see docs/redis.md).

Three shapes are read; tensorstream writes only the first:

* **manifest** -- key ``K`` is a hash ``{tensorstream, size, chunk_size,
  generation, checksum, mtime}``; the bytes live in string keys
  ``K:<generation>:<offset>`` of ``chunk_size`` bytes (the last one shorter).
  That is also the layout tensorizer's ``redis://host/K`` loader reads
  (it scans ``K:*`` and orders keys by the number after the last colon).
* **string** -- key ``K`` is a plain string: a one-chunk object.
* **tensorizer** -- no key ``K``, but keys ``K:<name>:<offset>`` written by
  ``TensorDeserializer.to_redis(client, K)``, contiguous from offset 0.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence

from ...errors import ProtocolError

__all__ = [
    "FORMAT_VERSION",
    "MAX_CHUNKS",
    "MAX_OBJECT_SIZE",
    "Layout",
    "chunk_key",
    "escape_glob",
    "is_a_date",
    "is_staged_chunk",
    "manifest_fields",
    "named_like_chunk",
    "parse_manifest",
    "replaced_chunk_keys",
    "tensorizer_layout",
]

FORMAT_VERSION = "1"
#: Bounds on what a manifest may claim (far beyond any Redis deployment's memory).
MAX_OBJECT_SIZE = 1 << 44
MAX_CHUNKS = 1 << 24
#: A manifest's mtime is seconds since the epoch in years 1 to 9999 (a datetime's).
_MTIME_START, _MTIME_END = -62135596800.0, 253402300800.0
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")
_CHUNK_SUFFIX = re.compile(rb":(\d+)\Z")  # (\Z: "$" also matches before a final line break)
_GENERATION = re.compile(r"[0-9a-f]{16}")
_GENERATION_CHUNK = re.compile(rb"[0-9a-f]{16}:\d+")
_NAMED_LIKE_CHUNK = re.compile(rb".:[0-9a-f]{16}:\d+\Z")


def escape_glob(text: str) -> str:
    """Escape Redis ``MATCH`` glob characters so ``text`` matches only itself."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _key(name: str) -> bytes:
    # Paths come from listings decoded with surrogateescape: a key that is not
    # UTF-8 must name the same bytes again, not fail the whole listing.
    return name.encode("utf-8", "surrogateescape")


def chunk_key(path: str, generation: str, offset: int) -> str:
    """Name of the chunk of ``path``'s ``generation`` starting at ``offset``."""
    return f"{path}:{generation}:{offset}"


def is_staged_chunk(path: str, key: bytes) -> bool:
    """Whether ``key`` is named like a chunk of ``path`` that a tensorstream
    writer stages: ``path:<generation: 16 hex digits>:<offset>``."""
    prefix = path.encode("utf-8", "surrogateescape") + b":"
    return key.startswith(prefix) and _GENERATION_CHUNK.fullmatch(key[len(prefix):]) is not None


def named_like_chunk(path: str) -> bool:
    """Whether ``path`` is named as a chunk of the object before its last two ``:`` is
    (``K:<16 hex digits>:<offset>``): beside that object a listing takes it for a stale
    chunk and leaves it out, so no object is written under such a name."""
    return _NAMED_LIKE_CHUNK.search(_key(path)) is not None


def chunk_offset(key: bytes) -> int | None:
    """The byte offset a ``...:<offset>`` key holds, or ``None``."""
    m = _CHUNK_SUFFIX.search(key)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the bytes of one object live."""

    kind: str  # "manifest" | "string" | "tensorizer"
    path: str
    size: int
    etag: str | None
    chunk_size: int = 0
    generation: str = ""
    checksum: str | None = None
    mtime: float | None = None
    #: tensorizer/string layouts: non-empty (key, start offset), sorted by offset.
    keys: tuple[tuple[bytes, int], ...] = ()
    #: tensorizer layout: zero-length keys (empty tensors), deleted with the object.
    empty_keys: tuple[bytes, ...] = ()

    def segments(self, offset: int, length: int) -> Iterator[tuple[bytes, int, int, bool]]:
        """``(key, start_in_key, length, whole)`` covering ``[offset, offset + length)``
        in order; ``whole``: the segment is all of the key's value. Generated one at a
        time: a 1 GiB read of 1 KiB chunks is a million segments."""
        end = offset + length
        if length <= 0:
            return
        if self.kind == "manifest":
            cs = self.chunk_size
            pos = offset
            while pos < end:
                start = pos - pos % cs
                n = min(end, start + cs) - pos
                whole = pos == start and n == min(cs, self.size - start)
                yield (_key(chunk_key(self.path, self.generation, start)), pos - start, n, whole)
                pos += n
            return
        i = bisect.bisect_right(self.keys, offset, key=lambda k: k[1]) - 1
        pos = offset
        while pos < end:
            key, start = self.keys[i]
            stop = self.keys[i + 1][1] if i + 1 < len(self.keys) else self.size
            n = min(end, stop) - pos
            yield (key, pos - start, n, pos == start and n == stop - start)
            pos += n
            i += 1

    def chunk_keys(self) -> Iterator[bytes]:
        """Every key holding this object's bytes (manifest key excluded), generated
        one at a time: memory stays flat whatever the manifest says."""
        if self.kind == "manifest":
            for start in range(0, self.size, self.chunk_size):
                yield _key(chunk_key(self.path, self.generation, start))
            return
        yield from (k for k, _ in self.keys)
        yield from self.empty_keys


def is_a_date(mtime: float) -> bool:
    """Whether ``mtime`` (seconds since the epoch) is a date a manifest may hold."""
    return _MTIME_START < mtime < _MTIME_END


def manifest_fields(*, size: int, chunk_size: int, generation: str, checksum: str,
                    mtime: float) -> dict[str, str]:
    """The hash fields a manifest is published with."""
    return {
        "tensorstream": FORMAT_VERSION,
        "size": str(size),
        "chunk_size": str(chunk_size),
        "generation": generation,
        "checksum": checksum,
        "mtime": f"{mtime:.6f}",
    }


def parse_manifest(path: str, fields: Mapping[bytes, bytes]) -> Layout:
    """A :class:`Layout` from a manifest hash; :class:`ProtocolError` if it is not one."""
    try:
        if fields.get(b"tensorstream") != FORMAT_VERSION.encode():
            raise KeyError("tensorstream")
        size = int(fields[b"size"])
        chunk_size = int(fields[b"chunk_size"])
        generation = fields[b"generation"].decode()
        checksum = fields.get(b"checksum", b"").decode() or None
        mtime = float(fields[b"mtime"]) if b"mtime" in fields else None
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"key {path!r} holds a hash that is not a tensorstream manifest "
                            f"(format {FORMAT_VERSION})") from exc
    if size < 0 or chunk_size < 1 or not (mtime is None or is_a_date(mtime)):
        # (an mtime of nan, inf or 1e300 is no date: stat failed with OverflowError)
        raise ProtocolError(f"corrupt tensorstream manifest at {path!r}")
    if _GENERATION.fullmatch(generation) is None:
        # Every writer names one with 16 hex digits, and only K:<16 hex>:<offset> is taken
        # for a chunk of K: a generation "v2" claimed the keys K:v2:0... that listings show
        # as objects of their own, and rm K (or a write over K) deleted them.
        raise ProtocolError(
            f"corrupt tensorstream manifest at {path!r}: its generation "
            f"{generation[:40]!r} is not 16 hex digits, as every writer names one")
    if size > MAX_OBJECT_SIZE or -(-size // chunk_size) > MAX_CHUNKS:
        # Numbers from a server are not trusted: a manifest claiming 10**15 bytes
        # in 1 KiB chunks is damage (or an attack), not an object to read or delete.
        raise ProtocolError(
            f"corrupt tensorstream manifest at {path!r}: it claims {size} bytes in chunks of "
            f"{chunk_size} (at most {MAX_OBJECT_SIZE} bytes and {MAX_CHUNKS} chunks)")
    return Layout("manifest", path, size, generation, chunk_size=chunk_size,
                  generation=generation, checksum=checksum, mtime=mtime)


def replaced_chunk_keys(path: str, old: Sequence[bytes | None]) -> Iterator[bytes]:
    """The chunk keys of the manifest a publish replaced, from its ``generation``,
    ``size``, ``chunk_size`` and ``tensorstream`` fields (``HMGET``), generated one
    at a time. None for a hash that is no manifest of ours (someone else's keys);
    :class:`ProtocolError` for numbers no manifest has (10**15 one-byte chunks were
    deleted 10,000 a round trip, for ever), checked before any is given."""
    gen, size, cs, version = (*old, None, None, None, None)[:4]
    if gen is None or version != FORMAT_VERSION.encode():
        return iter(())
    try:
        fields = {b"tensorstream": version, b"generation": gen, b"size": size or b"",
                  b"chunk_size": cs or b""}
        manifest = parse_manifest(path, fields)
    except ProtocolError as exc:
        raise ProtocolError(f"{exc.message}; its chunks are left where they are") from None
    return manifest.chunk_keys()


def tensorizer_layout(path: str, sized_keys: list[tuple[bytes, int]]) -> Layout | None:
    """A :class:`Layout` over ``to_redis`` keys ``path:<name>:<offset>`` with their sizes.

    ``None`` when there are none; :class:`ProtocolError` when the keys do not
    form one contiguous stream from offset 0 (a gap would mean zero-filled bytes).
    """
    entries: list[tuple[int, bytes, int]] = []
    for key, size in sized_keys:
        off = chunk_offset(key)
        if off is not None:
            entries.append((off, key, checked_strlen(path, key, size)))
    if not entries:
        return None
    entries.sort()
    pos = 0
    for off, key, size in entries:
        if off != pos:
            raise ProtocolError(
                f"keys under {path!r}:* are not one contiguous stream: expected offset {pos}, "
                f"found {key.decode(errors='replace')!r}"
            )
        pos += size
    digest = hashlib.sha1(usedforsecurity=False)
    for _off, key, size in entries:
        digest.update(b"%s\0%d\0" % (key, size))
    return Layout("tensorizer", path, pos, f"tz-{digest.hexdigest()[:20]}",
                  keys=tuple((key, off) for off, key, size in entries if size),
                  empty_keys=tuple(key for _, key, size in entries if not size))


def checked_strlen(path: str, key: bytes, size: object) -> int:
    """A ``STRLEN`` reply as a byte count, or :class:`ProtocolError`: a server's
    numbers are not trusted (a negative one read as an empty object; a huge one
    made ``read()`` allocate it)."""
    if type(size) is not int or not 0 <= size <= MAX_OBJECT_SIZE:
        raise ProtocolError(
            f"Redis reported the length {str(size)[:40]!r} for key "
            f"{key.decode(errors='replace')!r} of {path!r} (a length is 0 to "
            f"{MAX_OBJECT_SIZE} bytes)")
    return size


def string_layout(path: str, size: int) -> Layout:
    """A plain string value as a one-chunk object (no ETag: Redis keeps no version)."""
    key = _key(path)
    return Layout("string", path, checked_strlen(path, key, size), None, keys=((key, 0),))
