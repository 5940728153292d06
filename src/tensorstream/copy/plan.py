"""Planning a copy: which objects go where, decided before a byte is read.

:class:`Planner` (a base of the copy engine) lists or stats every source,
maps each object to its destination safely (:mod:`.keys`), applies
``--exclude``/``--include``, refuses copies of an object onto itself and
duplicate targets, looks for the destination bucket once, and leaves out
what ``sync``/``--resume`` find unchanged. Each object becomes a :class:`Job`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
import stat
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, PermissionDeniedError, TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers.base import ObjectInfo, listing_keeps_damaged
from ..uri import ParsedURI, is_utf8, parse_uri, redact_text
from .job import Job
from .keys import UnsafeKeyError, plan_keys, relative_key, safe_relative_key
from .metadata import holds_fields
from .places import connection, feeds_itself, inside, leads_into, same_store, way_out
from .select import FileOutcome, Rules, source_encryption_decides, unchanged, walk_local
from .server_side import takes as takes_on_server
from .sinks import temp_stem
from .wildcards import Wildcard, wildcard

if TYPE_CHECKING:
    from .result import CopyResult

__all__ = ["Job", "Planner", "names_no_object", "special_file"]


def names_no_object(uri: ParsedURI) -> bool:
    """Whether a remote destination names no object, only where objects go: a Redis
    database (``redis://host:6379``, which wrote the key ``""``) or an S3 bucket."""
    path = uri.path.strip("/")
    return not path or (uri.scheme in ("s3", "s3a") and "/" not in path)


def special_file(path: str) -> str | None:
    """What ``path`` is (symlinks followed) when it is a device, FIFO or socket, else None."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


class Planner:
    """The planning half of the copy engine (attributes set by the engine)."""

    side_options: dict[str, dict[str, Any]]
    options: dict[str, Any]
    rules: Rules
    skip_unchanged: bool
    resume: bool
    dryrun: bool
    follow_symlinks: bool
    #: ``*``/``?`` in a listable source's key make it a pattern (s5cmd's, :mod:`.wildcards`).
    wildcards: bool
    result: CopyResult
    #: Whether two connections (:func:`.places.connection`) are one store, as decided.
    stores: dict[tuple[tuple[Any, ...], tuple[Any, ...]], bool]
    #: What S3 stores with each object (a MetadataOptions: :mod:`.metadata`), or None.
    object_metadata: Any
    server_side_copy: bool
    server_copy_lacks: set[str]
    part_size: int
    #: (source provider, bucket) -> its default encryption, asked once (see _kms_by_default).
    bucket_encryption: dict[tuple[int, str], asyncio.Future[str | None]]

    def provider(self, uri: ParsedURI, side: str = "src") -> PolicyProvider:
        raise NotImplementedError

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

    # -- planning ------------------------------------------------------------
    async def plan(self, sources: list[str], dest: str, recursive: bool) -> list[Job]:
        dst_uri = parse_uri(dest)
        dst = self.provider(dst_uri, "dst")
        local = dst_uri.scheme == "file"
        # (a Redis URI's '/' comes before its query: redis://h/d/?db=2 is a folder)
        into_dir = len(sources) > 1 or recursive or dest.endswith("/") or (
            not local and dst_uri.path.endswith("/")) or (
            os.path.isdir(dst_uri.path) if local else names_no_object(dst_uri)) or (
            any(self._pattern(parse_uri(s)) is not None for s in sources))
        jobs: list[Job] = []
        seen: dict[str, str] = {}  # target -> the source going there
        for source in sources:
            src_uri = parse_uri(source)
            src = self.provider(src_uri, "src")
            # DST inside SRC (realpaths: a link, './', '//'; on a remote store the same
            # prefix): each run would copy the copies of the last one, a level deeper
            # (q/bk/x -> q/bk/bk/x), unless the rules leave them out.
            own = "" if not recursive else (
                inside(dst_uri.path, src_uri.path) if local and src_uri.scheme == "file"
                else "" if local else self._below(dst_uri, src_uri))
            # A damaged object in a listing is an entry (failed below if selected), not
            # the end of the listing: one the rules leave out is never looked at.
            keeps = listing_keeps_damaged.set(True)
            try:
                pairs = await self._list_source(src, src_uri, source, recursive, local)
            except (TensorstreamError, OSError) as exc:
                self.error(redact_text(source), exc)
                continue
            finally:
                listing_keeps_damaged.reset(keeps)
            if own and (key := feeds_itself(self.rules, own, (r for r, _ in pairs))):
                what, where = (("a directory", f"{dst_uri.path} is inside {src_uri.path}")
                               if local else ("a prefix", f"{redact_text(dest)} is under "
                                              f"{redact_text(source)}"))
                again = (f"{key} is under it" if key.startswith(own + "/")
                         else f"its copy {own}/{key} would be copied again")
                self.error(redact_text(source), f"refused: cannot copy {what} into itself "
                           f"({where}: {redact_text(again)}); {way_out(own)}")
                continue
            if recursive and local and src_uri.scheme == "file" and (key := leads_into(
                    dst_uri.path, src_uri.path,
                    ((r, i.path) for r, i in pairs if self.rules.wants(r)))):
                self.error(redact_text(source), "refused: cannot copy a directory into itself "
                           f"({redact_text(key)} is in {dst_uri.path} by a symbolic link); "
                           + way_out(posixpath.dirname(key)).replace(
                               "outside SRC", "outside SRC, pass --no-follow-symlinks"))
                continue
            one = not recursive and self._pattern(src_uri) is None
            for rel, info in pairs:
                if not self.rules.wants(rel):
                    continue  # --exclude/--include: left out by choice, not reported
                if (damaged := info.extra.get("damaged")) is not None:
                    self.refuse(redact_text(src_uri.with_path(info.path)), "", 0, damaged)
                    continue
                try:
                    if into_dir:  # else DST names it: the source's name does not matter
                        safe_relative_key(rel, filesystem=local)
                except UnsafeKeyError as exc:
                    hint = "; name the destination (cp SRC DIR/NAME)" if one else ""
                    self.refuse(redact_text(src_uri.with_path(info.path)), "", info.size,
                                f"refused: {exc}{hint}")
                    continue
                if local:
                    root = dst_uri.path if into_dir else os.path.dirname(dst_uri.path)
                    parts = rel.split("/") if into_dir else [os.path.basename(dst_uri.path)]
                    target = os.path.join(root, *parts)
                    job = Job(src, src_uri, info.path, info, dst, dst_uri, target, (root, parts))
                    if (kind := special_file(target)) is not None:
                        # The temp file's rename would replace the node itself: /dev/null
                        # (as root), a FIFO a reader waits on, /dev/stdout's link.
                        self.refuse(job.label, job.dst_label, info.size,
                                    f"refused: {target} is {kind}, which cp never "
                                   "replaces (it publishes whole files by rename); to write "
                                   f"into it: tensorstream cp SRC - > {target}")
                        continue
                else:
                    base = dst_uri.path.rstrip("/")
                    target = (f"{base}/{rel}" if base else rel) if into_dir else dst_uri.path
                    job = Job(src, src_uri, info.path, info, dst, dst_uri, target, None)
                    if dst_uri.scheme in ("s3", "s3a") and not is_utf8(target):
                        # A local name that is not UTF-8 (kept by Python as surrogates)
                        # cannot be an S3 key: refused here, by name; the bucket's check
                        # below lists under the first target and failed the whole copy.
                        self.refuse(job.label, job.dst_label, info.size,
                                    f"refused: S3 keys are UTF-8, {job.dst_label} "
                                    "is not (a file name in another encoding?)")
                        continue
                if self._same_object(job):
                    why = self._not_in_place(job)
                    if why is not None:
                        self.refuse(job.label, job.dst_label, info.size, why)
                        continue
                    job.in_place = True
                if target in seen:
                    if seen[target] != job.label:  # the same object twice (two patterns): once
                        self.refuse(job.label, job.dst_label, info.size,
                                    f"another source also maps to {job.dst_label}; skipped")
                    continue
                seen[target] = job.label
                jobs.append(job)
        if jobs and dst_uri.scheme == "s3":
            jobs = await self._check_bucket(dst, jobs)
        if self.skip_unchanged:
            jobs = await self._drop_unchanged(jobs)
        if not self.resume and not self.dryrun:
            for job in jobs:
                self._note_stale_partial(job)
        return jobs

    def _below(self, dst: ParsedURI, src: ParsedURI) -> str:
        """A remote ``dst`` relative to the prefix ``src`` where it lies under it on the same
        storage, else ``""``."""
        if not self._one_store(src, dst) or self._pattern(src) is not None:
            return ""  # two stores, or a pattern (what it matches is its own affair)
        top, below = src.path.strip("/"), dst.path.strip("/")
        if below == top or not (not top or below.startswith(top + "/")):
            return ""
        return below[len(top) + 1:] if top else below

    def _one_store(self, src: ParsedURI, dst: ParsedURI) -> bool:
        """Whether ``src`` and ``dst`` are on one store, whatever side options name no
        other (a profile or region per side, the same endpoint twice): :mod:`.places`."""
        key = (connection(src), connection(dst))
        if key not in self.stores:  # once per pair: resolving an S3 endpoint reads files
            self.stores[key] = same_store(src, dst, {**self.options, **self.side_options["src"]},
                                          {**self.options, **self.side_options["dst"]})
        return self.stores[key]

    def _same_object(self, job: Job) -> bool:
        """Whether ``job`` would copy an object onto itself (refused: it would be rewritten)."""
        if not self._one_store(job.src_uri, job.dst_uri):
            return False  # one name on two endpoints (a local file has none)
        if job.local is not None:
            try:
                return os.path.samefile(job.src_path, job.dst_path)
            except OSError:
                return os.path.abspath(job.src_path) == os.path.abspath(job.dst_path)
        return job.src_path == job.dst_path

    def _not_in_place(self, job: Job) -> str | None:
        """Why ``job``, an object onto itself, is refused; None where S3 changes its
        metadata in place (an S3 object, fields given, a copy by S3 possible)."""
        same = "refused: source and destination are the same object"
        if job.local is not None or job.dst_uri.scheme != "s3":
            return same
        given = self.object_metadata is not None and self.object_metadata.overrides()
        if not given:
            return (f"{same} (to change its metadata in place, as aws s3 cp "
                    "--metadata-directive REPLACE does, give --content-type, --cache-control "
                    "or --metadata)")
        place = "refused: changing an object's metadata in place is a copy by S3 onto itself"
        if not self.server_side_copy:
            return f"{place}, which --no-server-side-copy (server_side_copy=False) turns off"
        if not takes_on_server(self, job):
            return (f"{place}, made with one key pair: the source's and the destination's "
                    "differ here (give the same credentials to both sides)")
        return None

    async def _check_bucket(self, dst: PolicyProvider, jobs: list[Job]) -> list[Job]:
        """Look for the destination bucket once, before reading anything (where the
        destination's key may list it)."""
        bucket = jobs[0].dst_path.split("/", 1)[0]
        listing = dst.list(jobs[0].dst_path).__aiter__()
        try:
            await listing.__anext__()
        except StopAsyncIteration:
            pass
        except NotFoundError:
            where = self.side_options["dst"].get("s3_endpoint") or self.options.get("s3_endpoint")
            at = f" at {where}" if where else ""
            for job in jobs:
                self.refuse(job.label, job.dst_label, job.info.size,
                            f"bucket {bucket!r} does not exist{at} (create it first; "
                            "'tensorstream ls s3://' lists the buckets these credentials see)",
                            what=f"{job.label} -> {job.dst_label}")
            return []
        except PermissionDeniedError:
            # An upload-only key (s3:PutObject, as a drop bucket hands out) may not list:
            # all of the copy failed here, where aws s3 cp needs no more than the uploads.
            pass  # each upload says itself whether the bucket is there
        finally:
            aclose = getattr(listing, "aclose", None)
            if aclose is not None:
                await aclose()
        return jobs

    async def _drop_unchanged(self, jobs: list[Job]) -> list[Job]:
        """Leave out jobs whose destination already holds the source (sync, cp -r --resume)."""
        slots = asyncio.Semaphore(16)

        async def check(job: Job) -> Job | None:
            async with slots:
                try:
                    there = await job.dst.stat(job.dst_path)
                except (TensorstreamError, OSError):
                    return job  # absent (or unreadable: the copy reports it)
            if job.in_place:
                # An object onto itself is always its own copy: what is asked is its
                # metadata, so whether it holds the fields given decides (it was skipped
                # as unchanged, and nothing changed).
                if not holds_fields(there, self.object_metadata.overrides()):
                    return job
                self.outcome(FileOutcome(job.label, job.dst_label, job.info.size, "skipped",
                                         reason="metadata already as given"))
                return None
            same_kind = job.src_uri.scheme == job.dst_uri.scheme == "s3"
            info = job.info
            if source_encryption_decides(info, there, same_kind=same_kind):
                # Listed, not HEADed: only a HEAD says whether its ETag is an MD5 (one
                # more request, for an object whose ETag differs from its copy's), unless
                # its bucket encrypts with KMS by default (asked once): then it is not.
                if await self._kms_by_default(job):
                    info = dataclasses.replace(info, extra={**info.extra, "etag_not_md5": True})
                else:
                    async with slots:
                        try:
                            head = await job.src.stat(job.src_path)
                        except (TensorstreamError, OSError):
                            return job  # the copy reports it
                    if head.etag == info.etag and head.size == info.size:
                        info = head
            from .sync_dates import etag_says, in_its_second  # (sync's path only)

            if job.src_uri.scheme == "file" and info.size == there.size and in_its_second(
                    info, there):
                # A file dated within its copy's whole second: the dates cannot tell, the
                # copy's ETag can (where it is an MD5); otherwise it is copied once more.
                try:
                    if not await etag_says(job.src_path, info, there, self.part_size):
                        return job
                except OSError:
                    return job  # (the copy reports it)
            elif not unchanged(info, there, same_kind=same_kind):
                return job
            self.outcome(FileOutcome(job.label, job.dst_label, job.info.size, "skipped",
                                     reason="unchanged"))
            return None

        kept = await asyncio.gather(*(check(j) for j in jobs))
        return [j for j in kept if j is not None]

    async def _kms_by_default(self, job: Job) -> bool:
        """Whether ``job``'s source bucket encrypts objects with SSE-KMS or DSSE-KMS by
        default (GetBucketEncryption, once a bucket): its listed objects' ETags are taken
        as no MD5s, as a HEAD would say of each (an object stored with another encryption
        named is taken so too: the dates decide for it, as for aws s3 sync). False where
        the bucket has no such default or may not be asked."""
        from ..providers.s3.writer import KMS_ENCRYPTION

        inner = getattr(job.src, "inner", None)
        ask = getattr(inner, "default_encryption", None)
        if job.src_uri.scheme != "s3" or ask is None:
            return False
        key = (id(inner), job.src_path.split("/", 1)[0])
        if key not in self.bucket_encryption:
            self.bucket_encryption[key] = asyncio.ensure_future(ask(key[1]))
        return await asyncio.shield(self.bucket_encryption[key]) in KMS_ENCRYPTION

    def _note_stale_partial(self, job: Job) -> None:
        if job.local is None:
            return
        root, parts = job.local
        journal = os.path.join(root, *parts[:-1], f"{temp_stem(parts[-1])}journal.tmp")
        if os.path.exists(journal):
            self.result.notes.append(
                f"{job.dst_label}: an interrupted --resume copy was left here; without "
                "--resume it is discarded and the copy starts over")

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
                    raise NotFoundError(f"no such file or directory: {uri.path}") from None
                if uri.scheme == "file":
                    raise  # it is there, and the error says why it is no file (a FIFO, /proc)
                raise NotFoundError(f"nothing to copy at {redact_text(raw)}") from None
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
            return name, await src.stat(uri.path)
        except NotFoundError:
            if uri.scheme == "file":
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

