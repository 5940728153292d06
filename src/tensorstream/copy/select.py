"""What to copy, decided before the engine reads a byte.

* :class:`Rules`: ``--exclude``/``--include`` globs with the semantics of
  ``aws s3 cp``: everything is included to begin with, the rules are applied
  in the order given and the last rule that matches a key decides. Patterns
  are matched against the key relative to the source (``*`` also matches
  ``/``, as in aws).
* :func:`walk_local`: the files under a local directory, following symbolic
  links (to files and to directories, once each: a link loop is reported,
  not followed forever) unless asked not to; every entry left out is
  reported with the reason. A Hugging Face cache snapshot, where every file
  is a link into ``blobs/``, is copied as the files it shows.
* :func:`unchanged`: whether a destination object already holds the source's
  bytes, as ``aws s3 sync`` decides it (size, then ETag when both sides are
  of the same kind and the ETags are equal or MD5s of one piece each, then
  modification time: a local copy carries its source's).
* :class:`FileOutcome`: what happened to one object, for per-file output.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import os
import stat as stat_mod
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigurationError
from ..providers.base import ObjectInfo
from .keys import is_temp_name

__all__ = ["FileOutcome", "Rules", "notify", "source_encryption_decides", "special_kind",
           "unchanged",
           "walk_local"]

@dataclasses.dataclass
class FileOutcome:
    """One object's fate in a copy: the CLI prints one line (or JSON object) per outcome.

    ``status`` is ``copied``, ``failed``, ``skipped`` (unchanged or left out),
    ``dryrun`` (would be copied) or ``interrupted``. ``kept`` names the hidden
    partial file an interrupted ``--resume`` copy left for the next run;
    ``published`` is True when a remote destination was committed and is
    still there although the copy did not succeed: it stopped before its
    read-back verification finished, or failed it and could not remove it.
    ``server_side``: S3 copied it itself (no byte through this machine).
    """

    src: str
    dst: str
    size: int
    status: str
    error: str | None = None
    reason: str | None = None
    resumed_bytes: int = 0
    verified: bool = False
    kept: str | None = None
    kept_bytes: int = 0
    published: bool = False
    seconds: float = 0.0
    #: Copied by the S3 server itself; ``verified_by``: what of the copy was compared
    #: with the source (``"ETag"``), None when nothing was.
    server_side: bool = False
    verified_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields that say something (no empty ``dst``, no zero counts)."""
        out = {k: v for k, v in dataclasses.asdict(self).items()
               if v not in (None, False, 0, "") or k in ("src", "size", "status", "verified")}
        out["seconds"] = round(self.seconds, 6)
        return out


def notify(listener: Any, event: str, *args: Any) -> None:
    """Call ``listener.event(*args)`` if the listener has that (optional) method."""
    fn = getattr(listener, event, None) if listener is not None else None
    if fn is not None:
        fn(*args)


class Rules:
    """Ordered ``(kind, pattern)`` rules, kind ``"exclude"`` or ``"include"``; an include
    before any exclude changes nothing and is refused
    (:class:`~tensorstream.errors.ConfigurationError`, a ``ValueError``), as ``--include``
    first is on the command line.

    >>> r = Rules([("exclude", "*"), ("include", "*.safetensors")])
    >>> r.wants("model-00001.safetensors"), r.wants("optimizer.pt")
    (True, False)
    """

    def __init__(self, rules: Sequence[tuple[str, str]] = ()) -> None:
        excluded = False
        for kind, pattern in rules:
            if kind not in ("exclude", "include"):
                raise ValueError(f"rule kind must be exclude or include, got {kind!r}")
            if kind == "include" and not excluded:
                # It takes nothing back (all is included to begin with): s5cmd's and
                # rclone's "only these" took all, as the CLI's --include first did.
                raise ConfigurationError(
                    f"Rules: ('include', {pattern!r}) before any ('exclude', ...) changes "
                    "nothing: everything is included to begin with and the last rule that "
                    "matches a key decides (aws s3's order); to take only these, write "
                    f"Rules([('exclude', '*'), ('include', {pattern!r})])")
            excluded = excluded or kind == "exclude"
        self.rules = list(rules)
        # Compared in one Unicode form: a name made on macOS (NFD, "e" + a combining
        # accent) never matched the same name typed elsewhere (NFC), and was not left out.
        self._nfc = [(kind, unicodedata.normalize("NFC", pattern)) for kind, pattern in rules]

    def __bool__(self) -> bool:
        return bool(self.rules)

    def wants(self, key: str) -> bool:
        if not key.isascii():
            key = unicodedata.normalize("NFC", key)
        keep = True
        for kind, pattern in self._nfc:
            if fnmatch.fnmatchcase(key, pattern):
                keep = kind == "include"
        return keep


def walk_local(root: str, *, follow_symlinks: bool = True
               ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``([(relative key, path)], [(relative key, why skipped)])`` under ``root``, sorted."""
    files: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    # The directories being walked, from the top down: a link to one of them is a loop.
    # Not every directory seen: a second link to a directory (`latest -> v2`) is copied
    # again under its own name, as cp -rL does; it was reported as a loop, and the real
    # `v2` was left out when `latest` sorted first.
    walking: set[tuple[int, int]] = set()

    def enter(directory: str, rel: str) -> tuple[list[str], tuple[int, int]] | None:
        """The sorted names in ``directory`` and its identity, or None (reported) when it is
        not to be read."""
        try:
            st = os.stat(directory)
            names = sorted(os.listdir(directory))
        except OSError as exc:
            skipped.append((rel or ".", f"cannot read directory: {exc.strerror}"))
            return None
        ident = (st.st_dev, st.st_ino)
        if ident in walking:
            skipped.append((rel, "symbolic link loop (a link to a directory it is in)"))
            return None
        walking.add(ident)
        return names, ident

    # Depth first with a stack of our own, not recursion: a tree deeper than Python's
    # recursion limit (~1000 levels) is walked, not a RecursionError.
    top = root.rstrip("/") or "/"
    first = enter(top, "")
    frames: list[tuple[str, str, Iterator[str], tuple[int, int]]] = [] if first is None else [
        (top, "", iter(first[0]), first[1])]
    while frames:
        directory, rel, names, ident = frames[-1]
        name = next(names, None)
        if name is None:
            frames.pop()
            walking.discard(ident)
            continue
        path = os.path.join(directory, name)
        key = f"{rel}/{name}" if rel else name
        if is_temp_name(name):
            continue  # tensorstream's own temp/partial files
        try:
            lst = os.lstat(path)
        except OSError as exc:
            skipped.append((key, exc.strerror or "cannot stat"))
            continue
        is_link = stat_mod.S_ISLNK(lst.st_mode)
        if is_link and not follow_symlinks:
            skipped.append((key, "symbolic link (--no-follow-symlinks)"))
            continue
        try:
            st = os.stat(path) if is_link else lst
        except OSError:
            skipped.append((key, "broken symbolic link"))
            continue
        if stat_mod.S_ISDIR(st.st_mode):
            inner = enter(path, key)
            if inner is not None:
                frames.append((path, key, iter(inner[0]), inner[1]))
        elif stat_mod.S_ISREG(st.st_mode):
            files.append((key, path))
        else:
            # Never opened (a FIFO would wait for a writer, a device never end): named
            # with what it is, as aws s3 sync names the kinds it skips.
            skipped.append((key, f"{special_kind(st.st_mode) or 'something'} "
                                 "(not a regular file)"))
    return files, skipped


def special_kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is a device, FIFO or socket, else None."""
    for test, kind in ((stat_mod.S_ISCHR, "a character device"),
                       (stat_mod.S_ISBLK, "a block device"),
                       (stat_mod.S_ISFIFO, "a FIFO"), (stat_mod.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def _layout(etag: str) -> int | None:
    """The parts an S3 ETag was made of (0: one ``PutObject``), None if it has no MD5's
    shape (:func:`~tensorstream.providers.s3.etags.etag_md5`, which a write checks with)."""
    from ..providers.s3.etags import etag_md5  # (sync's comparison only: not at cp's start)

    md5 = etag_md5(etag)
    return None if md5 is None else md5[1] or 0


def _encrypted(info: ObjectInfo) -> bool:
    """Whether a HEAD said ``info``'s ETag is no MD5 of its bytes (SSE-KMS, DSSE, SSE-C)."""
    return info.extra.get("etag_not_md5") is True


def _comparable(src: ObjectInfo, dst: ObjectInfo) -> bool:
    """Whether the two ETags can decide: equal, or the MD5s of two objects stored in one
    piece each. Two ``-N`` ETags that differ, the same ``N`` or not, may be of the same
    bytes in parts of other sizes (3 x 8 MiB and 10 + 10 + 4 MiB are both ``-3``): which
    sizes S3 does not list, so they cannot say."""
    return bool(src.etag and dst.etag) and (
        src.etag == dst.etag or _layout(src.etag or "") == _layout(dst.etag or "") == 0)


def unchanged(src: ObjectInfo, dst: ObjectInfo | None, *, same_kind: bool,
              carries_date: bool = False, dates_kept: bool = False) -> bool:
    """True when ``dst`` already holds ``src``'s bytes, judged like ``aws s3 sync``.

    Different sizes: changed. Same kind of store and both ETags known and
    comparable: the ETags decide. S3 ETags of two part layouts (one ``PutObject``
    and parts, or parts of two sizes: ``MD5`` vs ``MD5-of-MD5s-N``) differ for
    the same bytes, and ``cp`` may write other parts than the source's, so a copy
    of an object uploaded otherwise was taken as changed and copied again on every
    ``sync``: such ETags say nothing, nor do two ``-N`` ETags that differ (their
    parts' sizes are not listed: the same ``N`` is no proof of one layout). Nor do
    they where either object is encrypted with SSE-KMS, DSSE-KMS or SSE-C (its HEAD
    says so): S3's ETag there is no MD5, and two copies of the same bytes never had
    the same one. Otherwise a destination
    at least as new as the source is taken as a copy of it (a remote one was written
    after its source was). Where the copy carries its source's modification time
    (``carries_date``: a local file, a Redis object), it is a copy only with that
    date: one dated otherwise was changed after the copy (as ``aws s3 sync`` downloads
    again a file newer than its object, and rclone copies when the dates differ).
    ``dates_kept`` (``cp -r --resume`` into such a place): at least as new, or the
    source's date as its filesystem keeps one (:func:`carried`).
    """
    if dst is None or dst.size != src.size:
        return False
    if same_kind and _comparable(src, dst):
        if src.etag == dst.etag:
            return True
        if not (_encrypted(src) or _encrypted(dst)):
            return False
    if src.mtime is not None and dst.mtime is not None:
        if carries_date:
            return carried(src.mtime, dst.mtime)
        return dst.mtime >= src.mtime or (dates_kept and carried(src.mtime, dst.mtime))
    return True


#: How far a carried date may be from its source's and be the same (its microsecond
#: rounded once more on the way through a float).
_SAME_DATE = datetime.timedelta(microseconds=2)
#: The steps of the dates filesystems keep, in microseconds: exFAT's 10 ms; HFS+'s, ext3's
#: and some NFS servers' second; FAT's 2 s (truncated by Linux, rounded up elsewhere).
_GRAINS_US = (10_000, 1_000_000, 2_000_000)
_US = datetime.timedelta(microseconds=1)


def carried(src: datetime.datetime, dst: datetime.datetime) -> bool:
    """Whether ``dst`` is ``src`` as a filesystem keeps a date: the same (to
    :data:`_SAME_DATE`), or ``src`` cut or rounded up to one of :data:`_GRAINS_US` (a copy
    onto FAT of a source dated to the nanosecond was otherwise copied again on every
    sync, as rclone's modify window and rsync's ``--modify-window`` allow), or FAT's
    earliest date where ``src`` is earlier (:func:`_at_fat_floor`)."""
    if abs(dst - src) <= _SAME_DATE:
        return True
    src_us, dst_us = _micros(src), _micros(dst)
    return any(dst_us % g == 0 and abs(dst_us - src_us) < g for g in _GRAINS_US) or (
        _at_fat_floor(src_us, dst_us))


#: The earliest date FAT and exFAT keep, 1980-01-01 00:00 (in UTC, microseconds): their
#: dates are local, so a mount's zone puts it 14 h earlier to 12 h later, in quarter hours.
_FAT_FLOOR_US = 315_532_800_000_000
_HOUR_US = 3_600_000_000


def _at_fat_floor(src_us: int, dst_us: int) -> bool:
    """Whether ``dst`` is FAT's earliest date that an earlier ``src`` was kept as: Linux
    stores a date before 1980 as 1980-01-01 00:00 there (a file of a reproducible build,
    dated 1970 as Nix and SOURCE_DATE_EPOCH=0 date them, was copied again on every sync)."""
    off = dst_us - _FAT_FLOOR_US
    return (src_us < dst_us and -14 * _HOUR_US <= off <= 12 * _HOUR_US
            and off % (_HOUR_US // 4) == 0)


def _micros(when: datetime.datetime) -> int:
    """Microseconds since the epoch (a date without a zone is UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return (when - _EPOCH) // _US


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def source_encryption_decides(src: ObjectInfo, dst: ObjectInfo | None, *,
                              same_kind: bool) -> bool:
    """Whether :func:`unchanged` would call ``dst`` changed by its ETag alone while the
    source's encryption is unknown (an entry of a listing, which does not say it): a
    HEAD of the source tells whether its ETag is an MD5 at all."""
    return (same_kind and dst is not None and dst.size == src.size and _comparable(src, dst)
            and src.etag != dst.etag and not _encrypted(dst)
            and "etag_not_md5" not in src.extra)
