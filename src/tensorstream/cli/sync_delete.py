"""``tensorstream sync --delete``: remove the objects under DST that are not under SRC.

Run after the copy, only where all of SRC was read and copied: SRC and DST are listed
again, as strictly as the copy lists (a listing that broke off, or an entry of a local
tree skipped for a problem, deletes nothing), and every key of DST that SRC lacks and
the rules select is deleted (or, with ``--dryrun``, named).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from ..copy.result import CopyResult
from ..copy.select import Rules
from ..errors import TensorstreamError
from ..uri import parse_uri, redact_text
from .output import Reporter

__all__ = ["delete_extraneous"]


async def delete_extraneous(args: argparse.Namespace, source: str, dest: str, rules: Rules,
                            result: CopyResult, reporter: Reporter,
                            src_options: dict[str, Any], dst_options: dict[str, Any]) -> None:
    """``sync --delete``: remove objects under DST whose key is not under SRC."""
    from ..api import get_provider
    from ..providers.base import listing_keeps_damaged

    # An entry skipped for a problem (a broken symlink, an unreadable directory)
    # is in SRC but not in its listing: its copy at DST is not extraneous.
    if result.errors or any(o.status == "skipped" and o.error for o in result.outcomes):
        # (Said as it is: a copy that failed, a missing destination bucket, were called
        # "the source was not read completely".)
        reporter.warning("--delete skipped: not all of the source was read and copied (see "
                         "the errors), so nothing is deleted")
        return
    src_uri, dst_uri = parse_uri(source), parse_uri(dest)
    async with get_provider(src_uri, **src_options) as src, \
            get_provider(dst_uri, **dst_options) as dst:
        try:
            # Listed again (the copy's listing is not kept), and as strictly: a listing
            # that broke off, or an entry skipped for a problem since the copy's, would
            # have the objects it left out deleted at DST.
            # (a damaged object at SRC is under SRC all the same: its copy is kept)
            keeps = listing_keeps_damaged.set(True)
            try:
                wanted = set(await _keys(src, src_uri, args.follow_symlinks, whole=True))
            finally:
                listing_keeps_damaged.reset(keeps)
            left: list[tuple[str, str]] = []
            deep: set[str] = set()  # keys whose path is past PATH_MAX
            there = await _keys(dst, dst_uri, False, dst=True, left=left, deep=deep)
        except (TensorstreamError, OSError) as exc:
            result.errors.append(f"--delete skipped: a listing failed, so nothing is deleted "
                                 f"({redact_text(str(exc) or type(exc).__name__)})")
            return
        if not wanted:
            # SRC named one object (it was copied): nothing under DST is "under SRC",
            # so every object there, the one just copied too, would be deleted.
            result.errors.append(f"--delete skipped: {redact_text(source)} is not a directory "
                                 "or prefix with objects under it, so nothing is deleted")
            return
        for key, why in left:
            # A link at DST is never deleted (nor followed); one SRC lacks was kept
            # without a word, DST taken for SRC's mirror. (A directory that could
            # not be read: what is under it was not looked at.)
            if key not in wanted and rules.wants(key):
                where = os.path.join(dst_uri.path, *key.split("/"))
                if why.startswith("symbolic link"):
                    why = "a symbolic link, which sync --delete never deletes (rm it if it should go)"
                elif why.startswith("cannot read directory"):
                    why += "; nothing under it was looked at"
                reporter.warning(f"--delete left {where} alone: {why}")
        same_file = _SameFileInOtherCase(wanted, there, left, dst_uri.path) if (
            dst_uri.scheme == "file") else None
        for key, path in sorted(there.items()):
            if key in wanted or not rules.wants(key):
                continue
            if same_file is not None and (twin := same_file(key)) is not None:
                # On FAT, NTFS, APFS, SMB, an ext4 casefold directory, A.bin is SRC's
                # a.bin (renamed in case since the last sync): the copy just wrote into
                # it, and deleting it deleted that copy.
                reporter.warning(f"--delete left {os.path.join(dst_uri.path, *key.split('/'))} "
                                 f"alone: on this filesystem, which ignores case, it is "
                                 f"the copy of {twin} (rename it to match, if it should)")
                continue
            uri = dst_uri.with_path(path)
            if args.dryrun:
                reporter.deleted(uri, dryrun=True)
                continue
            try:
                if key in deep:
                    from .sync_delete_deep import unlink_deep

                    await asyncio.to_thread(unlink_deep, dst_uri.path, key)
                else:
                    await dst.delete(path)
            except Exception as exc:
                if _gone(exc, dst_uri.scheme, path):
                    # Gone since the listing: deleted by another run (two `sync --delete`
                    # at once), which is what was asked; as S3's delete of no key.
                    reporter.deleted(uri, dryrun=False)
                    continue
                # In the summary's "errors" too (a --json reader saw "errors": [] and
                # exit status 3); redacted, as the line's own "error" now is.
                result.errors.append(redact_text(f"delete {uri}: {exc}"))
                reporter.deleted(uri, dryrun=False, error=result.errors[-1])
            else:
                reporter.deleted(uri, dryrun=False)


class _SameFileInOtherCase:
    """Which key of SRC a key of a local DST is, only in other case, where DST's
    filesystem ignores case: the filesystem finds SRC's name (the copy wrote it) though
    no entry of DST's listing has it, so it is another entry's name in other case.

    Asked of the two names themselves, not of a probe file's case: Python's folding is
    not a filesystem's (``straße``/``STRASSE`` are two files on NTFS and APFS, ``é`` in
    NFC and NFD two on NTFS, FAT and ext4 casefold; casefold is set per directory), and
    two files there that only fold alike here were kept, the old one never deleted.
    Makes nothing, so ``--dryrun`` shows what the run does."""

    def __init__(self, wanted: set[str], there: dict[str, str],
                 left: list[tuple[str, str]], root: str) -> None:
        self.wanted, self.root = wanted, root
        self._listed = set(there).union(key for key, _ in left)
        self._folded: dict[str, str] | None = None

    def __call__(self, key: str) -> str | None:
        from ..copy.case_names import folded

        if self._folded is None:  # (built at the first key SRC lacks)
            self._folded = {folded(k.split("/")): k for k in sorted(self.wanted)}
        twin = self._folded.get(folded(key.split("/")))
        if twin is None or twin in self._listed:
            return None  # (listed: a file of its own, beside this one)
        return twin if os.path.lexists(os.path.join(self.root, *twin.split("/"))) else None


def _gone(exc: BaseException, scheme: str, path: str) -> bool:
    """Whether a local delete failed only because nothing has the name any more
    (not for a directory in the way, which the local provider also calls not found)."""
    return isinstance(exc, FileNotFoundError) and scheme == "file" and not os.path.lexists(path)


async def _keys(provider: Any, uri: Any, follow_symlinks: bool, *, whole: bool = False,
                dst: bool = False, left: list[tuple[str, str]] | None = None,
                deep: set[str] | None = None) -> dict[str, str]:
    """``{key relative to uri: provider path}`` of every object under ``uri``; with
    ``whole``, an entry of a local tree skipped for a problem (not by choice) raises;
    ``left`` gets a local tree's entries skipped (key, why); ``deep``, where given, the
    keys of a local tree past PATH_MAX, listed (and to be deleted) a directory at a time."""
    from ..copy.keys import folder_base, relative_key
    from ..copy.select import walk_local
    from ..errors import NotFoundError

    if uri.scheme == "file":
        if not os.path.isdir(uri.path):
            return {}
        files, skipped = walk_local(uri.path, follow_symlinks=follow_symlinks)
        if deep is not None:  # past PATH_MAX: reached a directory at a time, as the copy
            from .sync_delete_deep import listed_deep, too_long  # wrote it

            beyond = [key for key, why in skipped if too_long(why)]
            skipped = [(key, why) for key, why in skipped if not too_long(why)]
            for key in beyond:
                for below, why in listed_deep(uri.path, key):
                    if why:
                        skipped.append((below, why))
                    else:
                        deep.add(below)
                        files.append((below, os.path.join(uri.path, *below.split("/"))))
        problems = [f"{key}: {why}" for key, why in skipped
                    if not why.endswith("(--no-follow-symlinks)")]
        if whole and problems:
            raise OSError(f"{uri.path} was not read completely: {problems[0]}")
        if left is not None:
            left += skipped
        return dict(files)
    if not provider.capabilities.list:
        return {}  # HTTP(S): one object, nothing under it (--delete says so, deletes nothing)
    # DST's keys are where the copy put them (a '//' kept: s3://b/p// holds p//a);
    # SRC's are named as its listing names them.
    base = (folder_base(uri.path) if dst else uri.path.rstrip("/")) + "/"
    if base == "/":
        base = ""
    out: dict[str, str] = {}
    listed = False
    try:
        async for info in provider.list(base):
            listed = True
            rel = relative_key(info.path, base)
            if rel is not None:
                out[rel] = info.path
    except NotFoundError:
        if listed:
            raise  # broke off after its first entries: not all of what is there
    return out
