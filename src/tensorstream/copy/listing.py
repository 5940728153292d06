"""Listing a copy's sources: the objects each one names, before any is planned.

:class:`SourceLister` (a base of :class:`.plan.Planner`) turns one source into
``(key relative to it, ObjectInfo)`` pairs: a local directory walked (symbolic links
followed unless ``--no-follow-symlinks``), a prefix or bucket listed, a wildcard
matched (:mod:`.wildcards`), one object stat'ed. What it cannot name safely is
refused (:mod:`.keys`); a source that names nothing says why (add ``-r``, no such
bucket, nothing to copy).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers.base import ObjectInfo
from ..uri import ParsedURI, redact_text, windows_path_hint
from .keys import plan_keys, relative_key
from .select import FileOutcome, walk_local
from .wildcards import Wildcard, wildcard

if TYPE_CHECKING:
    from .result import CopyResult

__all__ = ["SourceLister", "names_no_object"]


def names_no_object(uri: ParsedURI) -> bool:
    """Whether a remote destination names no object, only where objects go: a Redis
    database (``redis://host:6379``, which wrote the key ``""``) or an S3 bucket."""
    path = uri.path.strip("/")
    return not path or (uri.scheme in ("s3", "s3a") and "/" not in path)


class SourceLister:
    """What a copy's sources name (attributes set by the engine)."""

    result: CopyResult
    follow_symlinks: bool
    #: ``*``/``?`` in a listable source's key make it a pattern (s5cmd's, :mod:`.wildcards`).
    wildcards: bool

    def error(self, what: str, exc: BaseException | str) -> None:
        raise NotImplementedError

    def outcome(self, outcome: FileOutcome) -> None:
        raise NotImplementedError

    def refuse(self, src: str, dst: str, size: int, why: BaseException | str, *,
               what: str | None = None) -> None:
        """An object left out while planning: an error (about ``what``, default ``src``)
        and its outcome (a ``failed`` line in ``--json``, as for an object whose copy
        failed; it had none, so a reader of the lines saw fewer failures than the
        summary counted)."""
        self.error(what or src, why)
        self.outcome(FileOutcome(src, dst, size, "failed", error=self.result.errors[-1]))

    # -- listing -------------------------------------------------------------
    def _pattern(self, uri: ParsedURI) -> Wildcard | None:
        return wildcard(uri) if self.wildcards else None

    async def _list_source(self, src: PolicyProvider, uri: ParsedURI, raw: str, recursive: bool,
                           local_dst: bool) -> list[tuple[str, ObjectInfo]]:
        pattern = self._pattern(uri)
        if pattern is not None:
            return await self._matching(src, uri, raw, pattern, local_dst)
        if not recursive:
            return [await self._single(src, uri, raw)]
        if uri.scheme != "file" and not src.capabilities.list:
            # HTTP(S): nothing to list, so "cp -r URL" copies the object it names, as
            # "cp -r" of one S3 object does (it failed with "does not support list").
            if uri.path.endswith("/"):
                raise NotFoundError(f"{uri.scheme} has no listing, so -r cannot copy what "
                                    "is under it; name each object")
            return [await self._single(src, uri, raw)]
        if uri.scheme == "file" and os.path.isdir(uri.path):
            return await self._walk_local(src, uri)
        base = uri.path.rstrip("/") + "/"
        by_key: dict[str, ObjectInfo] = {}
        if base == "/" and uri.scheme != "file":
            base = ""  # the whole bucket / database
        listed = False
        try:
            async for info in src.list(base if uri.scheme != "file" else uri.path):
                listed = True
                rel = relative_key(info.path, base)
                if rel is not None:  # outside the prefix (e.g. "data-evil/"): not ours
                    by_key[rel] = info
        except NotFoundError as exc:
            if "NoSuchBucket" in str(exc) or listed:
                # A listing that broke off after its first entries (a 404 for a later
                # page) is no empty prefix: what it had would pass for all of SRC.
                raise  # said as it is, not as the stat below failing on a bare bucket
        if not by_key:
            if uri.scheme in ("s3", "s3a") and names_no_object(uri):
                raise NotFoundError(f"nothing to copy at {redact_text(raw)} (the bucket "
                                    "is empty)")
            try:  # "cp -r" of a single object copies that object
                info = await src.stat(uri.path)
            except NotFoundError:
                if uri.scheme == "file" and not os.path.lexists(uri.path):
                    # A typo in a local path is no "nothing to copy": say it is not there.
                    raise NotFoundError(f"no such file or directory: {uri.path}"
                                        f"{_local_wildcard(uri.path)}"
                                        f"{windows_path_hint(uri.path)}") from None
                if uri.scheme == "file":
                    raise  # it is there, and the error says why it is no file (a FIFO, /proc)
                raise NotFoundError(f"nothing to copy at {redact_text(raw)}") from None
            if uri.scheme != "file" and uri.path.endswith("/"):
                # An empty folder (the S3 console's marker alone) was copied as a file
                # named after it; keys ending in '/' are never copied (plan_keys).
                held = f" holding {info.size} bytes" if info.size else ""
                raise NotFoundError(f"nothing to copy at {redact_text(raw)} (an empty folder: "
                                    f"only its marker{held}, and keys ending in '/' are "
                                    "not copied)")
            return [(posixpath.basename(uri.path.rstrip("/")), info)]
        return self._planned(by_key, uri, base, local_dst)

    async def _matching(self, src: PolicyProvider, uri: ParsedURI, raw: str, pattern: Wildcard,
                        local_dst: bool) -> list[tuple[str, ObjectInfo]]:
        """The objects a wildcard source matches, named from the pattern's base."""
        if not src.capabilities.list:
            raise NotFoundError(f"{redact_text(raw)}: this storage cannot be listed, so a "
                                "wildcard cannot be matched (name the object)")
        by_key: dict[str, ObjectInfo] = {}
        listed = False
        try:
            async for info in src.list(pattern.prefix):
                listed = True
                rel = pattern.relative(info.path)
                if rel is not None:
                    by_key[rel] = info
        except NotFoundError as exc:
            if "NoSuchBucket" in str(exc) or listed:
                raise  # a listing that broke off is not all of the matches
        if not by_key:
            raise NotFoundError(f"no object matches {redact_text(raw)}")
        return self._planned(by_key, uri, pattern.base, local_dst)

    def _planned(self, by_key: dict[str, ObjectInfo], uri: ParsedURI, base: str,
                 local_dst: bool) -> list[tuple[str, ObjectInfo]]:
        """Listed objects by their relative keys, unsafe and unnamable keys reported."""
        plan = plan_keys(list(by_key), filesystem=local_dst)
        label = redact_text(uri.with_path(base))
        for key, reason in plan.refused:
            self.refuse(f"{label}{key}", "", by_key[key].size, f"refused: {reason}")
        for key, reason in plan.skipped:
            if by_key[key].size:  # bytes a filesystem has no name for: not left out quietly
                self.refuse(f"{label}{key}", "", by_key[key].size,
                            f"skipped: a {reason} holding {by_key[key].size} bytes (keys "
                            "ending in '/' are not copied)")
            else:
                self.result.skipped.append(f"{label}{key}: {reason}")
        return [(rel, by_key[key]) for key, rel in plan.copy]

    async def _single(self, src: PolicyProvider, uri: ParsedURI, raw: str
                      ) -> tuple[str, ObjectInfo]:
        """The one object a source without -r names; a directory or prefix says to add -r."""
        # Only an HTTP(S) path carries a query; a file (or key) named "q?m" is "q?m", not "q".
        path = uri.path.split("?", 1)[0] if uri.scheme in ("http", "https") else uri.path
        name = posixpath.basename(path.rstrip("/")) or "index"
        if uri.scheme == "file" and os.path.isdir(uri.path):
            raise NotFoundError(f"{uri.path} is a directory; add -r (--recursive) to copy "
                                "the files in it")
        if uri.scheme in ("s3", "s3a") and names_no_object(uri):
            # A bare bucket is no object: stat said only "S3 paths are bucket/key".
            if await self._what_is_under(src, uri.path) == "no bucket":
                raise NotFoundError(f"bucket {uri.path.strip('/')!r} does not exist "
                                    "('tensorstream ls s3://' lists the buckets these "
                                    "credentials see)")
            raise NotFoundError(f"{redact_text(raw)} is a bucket, not an object; add -r "
                                "(--recursive) to copy the objects in it")
        if uri.scheme != "file" and uri.path.endswith("/") and (
                await self._what_is_under(src, uri.path) == "objects"):
            # A folder marker ("dir/", as the S3 console makes) was copied as an empty
            # file named "dir"; without the marker the same command said to add -r.
            raise NotFoundError(f"{redact_text(raw)} is a prefix, not an object; add -r "
                                "(--recursive) to copy the objects under it")
        try:
            info = await src.stat(uri.path)
        except NotFoundError as exc:
            if uri.scheme == "file":
                if (hint := _local_wildcard(uri.path)) and not os.path.lexists(uri.path):
                    raise NotFoundError(f"no such file: {uri.path}{hint}") from exc
                raise
            under = await self._what_is_under(src, uri.path)
            if under == "objects":
                raise NotFoundError(
                    f"{redact_text(raw)} is a prefix, not an object; add -r (--recursive) "
                    "to copy the objects under it") from None
            if under == "no bucket":
                bucket = uri.path.split("/", 1)[0]
                raise NotFoundError(
                    f"bucket {bucket!r} does not exist ('tensorstream ls s3://' lists the "
                    "buckets these credentials see)") from None
            raise
        if uri.scheme != "file" and uri.path.endswith("/") and src.capabilities.list:
            # A folder marker alone (an empty S3 console folder) was written as an empty
            # file named after the folder; keys ending in '/' are never copied.
            what = f"holding {info.size} bytes" if info.size else "(an empty folder)"
            raise NotFoundError(f"{redact_text(raw)} is a folder marker {what}, not an "
                                "object: keys ending in '/' are not copied")
        return name, info

    @staticmethod
    async def _what_is_under(src: PolicyProvider, path: str) -> str | None:
        """``"objects"`` under ``path/``, ``"no bucket"``, or None (nothing we can see)."""
        if not src.capabilities.list:
            return None  # HTTP: no prefixes to see
        listing: Any = None
        try:
            listing = src.list(path.rstrip("/") + "/").__aiter__()
            await listing.__anext__()
            return "objects"
        except NotFoundError as exc:  # S3 names the missing bucket in a listing's answer
            return "no bucket" if "NoSuchBucket" in str(exc) else None
        except Exception:  # not a prefix we can see
            return None
        finally:
            aclose = getattr(listing, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    pass

    async def _walk_local(self, src: PolicyProvider, uri: ParsedURI
                          ) -> list[tuple[str, ObjectInfo]]:
        """A local directory, symbolic links followed unless --no-follow-symlinks."""
        files, skipped = await asyncio.to_thread(walk_local, uri.path,
                                                 follow_symlinks=self.follow_symlinks)
        base = uri.path.rstrip("/") + "/"
        for key, reason in skipped:
            self.result.skipped.append(f"{base}{key}: {reason}")
            by_choice = reason.endswith("(--no-follow-symlinks)")
            self.outcome(FileOutcome(f"{base}{key}", "", 0, "skipped", reason=reason,
                                     error=None if by_choice else reason))
        slots = asyncio.Semaphore(16)

        async def one(key: str, path: str) -> tuple[str, ObjectInfo] | None:
            async with slots:
                try:
                    return key, await src.stat(path)
                except (TensorstreamError, OSError) as exc:
                    self.error(path, exc)
                    return None

        found = await asyncio.gather(*(one(k, p) for k, p in files))
        out = [f for f in found if f is not None]
        if not out and not skipped and not files:  # (files that failed are reported above)
            raise NotFoundError(f"nothing to copy at {uri.path} (empty directory)")
        return out


def _local_wildcard(path: str) -> str:
    """What to add to "no such file" for a local path holding ``*`` or ``?`` (s5cmd
    matches those itself; here the shell does), else ``""``."""
    first = min((i for i in (path.find("*"), path.find("?")) if i >= 0), default=-1)
    if first < 0:
        return ""
    folder = posixpath.dirname(path[:first]) or "."
    rest = path[len(folder) + 1:] if path.startswith(folder + "/") else path
    return (f" (local paths are not wildcard-matched here: leave the pattern unquoted for "
            f"the shell to expand, or copy the folder: cp -r --exclude '*' --include "
            f"{rest!r} {folder}/ DST)")
