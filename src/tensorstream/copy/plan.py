"""Planning a copy: which objects go where, decided before a byte is read.

:class:`Planner` (a base of the copy engine) takes what every source names
(listed or stat'ed by its base, :class:`.listing.SourceLister`), maps each
object to its destination safely (:mod:`.keys`), applies
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
from typing import Any

from ..errors import NotFoundError, PermissionDeniedError, TensorstreamError
from ..layers.stack import PolicyProvider
from ..providers.base import ObjectInfo, listing_keeps_damaged
from ..providers.s3.key_limit import key_too_long
from ..uri import ParsedURI, is_utf8, parse_uri, redact_text
from .case_names import collisions, folds_case
from .job import Job
from .keys import UnsafeKeyError, folder_base, safe_relative_key
from .listing import SourceLister, names_no_object
from .metadata import holds_fields
from .places import connection, feeds_itself, inside, leads_into, same_store, way_out
from .select import FileOutcome, Rules, source_encryption_decides, special_kind, unchanged
from .server_side import takes as takes_on_server
from .sinks import temp_stem

__all__ = ["Job", "Planner", "names_no_object", "special_file"]


def special_file(path: str) -> str | None:
    """What ``path`` is (symlinks followed) when it is a device, FIFO or socket, else None."""
    try:
        return special_kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def _past_path_max(job: Job) -> bool:
    """Whether ``job``'s local destination has a path longer than the system takes whole."""
    return job.local is not None and len(os.fsencode(job.dst_path)) >= _PATH_MAX


#: Linux's PATH_MAX: ``os.stat`` of a longer path fails (``File name too long``).
_PATH_MAX = 4096
#: Destinations whose copies carry their source's modification time (sync compares it).
_CARRY_DATES = ("file", "redis", "rediss")


class Planner(SourceLister):
    """The planning half of the copy engine (attributes set by the engine); what each
    source names is listed by its base, :class:`.listing.SourceLister`."""

    side_options: dict[str, dict[str, Any]]
    options: dict[str, Any]
    rules: Rules
    skip_unchanged: bool
    resume: bool
    dryrun: bool
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
            matched = self._pattern(src_uri)  # (a wildcard matches keys below, -r or not)
            own = "" if not recursive and matched is None else (
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
            if not own and not local and (recursive or matched is not None) and (
                    self._one_more_slash(dst_uri, src_uri)):
                # s3://b/p// holds p//a, under p/: the next run lists it as '/a' (refused).
                self.error(redact_text(source), "refused: cannot copy a prefix into itself "
                           f"({redact_text(dest)} is {redact_text(source)} with a '/' more, "
                           "so its copies are under SRC); copy to a place outside SRC")
                continue
            if own and (key := feeds_itself(self.rules, own, (r for r, _ in pairs),
                                            None if matched is None else matched.names)):
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
                    base = folder_base(dst_uri.path)  # (a '//' kept, as aws s3 keeps it)
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
                    if dst_uri.scheme in ("s3", "s3a") and (
                            why := key_too_long(target.partition("/")[2])):
                        # S3 refuses it only once a request carries it (after a multipart
                        # upload began); moto and some S3-compatibles store it.
                        self.refuse(job.label, job.dst_label, info.size, f"refused: {why}")
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
        if local and len(jobs) > 1 and not self.dryrun:
            jobs = self._one_file_each(jobs)
        if jobs and dst_uri.scheme == "s3":
            jobs = await self._check_bucket(dst, jobs)
        if self.skip_unchanged:
            jobs = await self._drop_unchanged(jobs)
        if not self.resume and not self.dryrun:
            for job in jobs:
                self._note_stale_partial(job)
        return jobs

    def _one_file_each(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` less those whose local destination is another's on a filesystem
        that ignores case (``A.bin``, ``a.bin``: :mod:`.case_names`), refused: copied,
        the later replaced the earlier, and both were reported copied."""
        targets = [j.local for j in jobs if j.local is not None]
        if len(targets) != len(jobs):
            return jobs
        asked: dict[tuple[str, tuple[str, ...], str, str], bool] = {}

        def one(root: str, at: list[str], a: str, b: str) -> bool:
            if (root, tuple(at), a, b) not in asked:
                asked[root, tuple(at), a, b] = folds_case(root, at, (a, b))
            return asked[root, tuple(at), a, b]

        dropped: set[int] = set()
        for first, later in collisions(targets):
            root, parts = targets[later]
            # One file only where the filesystem takes each name that differs for the
            # other's (asked of the two names: Python's folding is not a filesystem's).
            earlier = targets[first][1]
            if len(earlier) == len(parts) and all(
                    a == b or one(root, parts[:i], a, b)
                    for i, (a, b) in enumerate(zip(earlier, parts, strict=True))):
                job, kept = jobs[later], jobs[first]
                self.refuse(job.label, job.dst_label, job.info.size,
                            f"refused: {job.dst_label} and {kept.dst_label} are one file on "
                            "this destination (its filesystem ignores case): copying both "
                            f"would leave one; {kept.label} is copied, this one is not "
                            "(copy it to another name)")
                dropped.add(later)
        return [j for i, j in enumerate(jobs) if i not in dropped] if dropped else jobs

    def _below(self, dst: ParsedURI, src: ParsedURI) -> str:
        """A remote ``dst`` relative to the prefix ``src`` where it lies under it on the same
        storage, else ``""``."""
        if not self._one_store(src, dst):
            return ""
        # (a pattern's keys are named from its base: p/* into p/bk/ copies p/a to p/bk/a,
        # which p/* matches on the next run)
        pattern = self._pattern(src)
        top = (src.path if pattern is None else pattern.base).strip("/")
        below = dst.path.strip("/")
        if below == top or not (not top or below.startswith(top + "/")):
            return ""
        return below[len(top) + 1:] if top else below

    def _one_more_slash(self, dst: ParsedURI, src: ParsedURI) -> bool:
        """Whether a remote ``dst`` folder is the prefix ``src`` with a ``/`` more
        (``s3://b/p//``: its keys, ``p//a``, are under ``p/``) on the same storage."""
        pattern = self._pattern(src)
        top = (src.path if pattern is None else pattern.base).rstrip("/")
        base = folder_base(dst.path)
        return bool(top) and base != top and base.rstrip("/") == top and self._one_store(
            src, dst)

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
        # (--copy-props none/metadata-directive alone change it too: its tags dropped, as
        # aws s3 cp's REPLACE directives drop them)
        given = self.object_metadata is not None and (
            self.object_metadata.overrides() or self.object_metadata.copy_props != "default")
        if not given:
            return (f"{same} (to change its metadata in place, as aws s3 cp "
                    "--metadata-directive REPLACE does, give --content-type, --cache-control "
                    "or --metadata; --copy-props none or metadata-directive drops its tags)")
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
            # One error for the bucket, each object failed with it: the same line once
            # per object was thousands of lines for a big tree.
            self.error(f"s3://{bucket}/", f"bucket {bucket!r} does not exist{at} (create it "
                       "first; 'tensorstream ls s3://' lists the buckets these credentials see)")
            for job in jobs:
                self.outcome(FileOutcome(job.label, job.dst_label, job.info.size, "failed",
                                         error=self.result.errors[-1]))
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
                    there = await (self._stat_deep(job) if _past_path_max(job)
                                   else job.dst.stat(job.dst_path))
                except (TensorstreamError, OSError, UnsafeKeyError):
                    return job  # absent (or unreadable: the copy reports it)
            if job.in_place:
                # An object onto itself is always its own copy: what is asked is its
                # metadata, so whether it holds the fields given decides (it was skipped
                # as unchanged, and nothing changed). --copy-props none/metadata-directive
                # also drop its tags, which only a GetObjectTagging (what they spare) shows:
                # always changed then.
                if self.object_metadata.copy_props != "default" or not holds_fields(
                        there, self.object_metadata.overrides()):
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

            carries = job.dst_uri.scheme in _CARRY_DATES
            if job.src_uri.scheme == "file" and not carries and info.size == there.size and (
                    in_its_second(info, there)):
                # A file dated within its copy's whole second: the dates cannot tell, the
                # copy's ETag can (where it is an MD5); otherwise it is copied once more.
                # (A copy carrying the file's date, kept to the second by its filesystem,
                # has no such ETag: its date says.)
                try:
                    if not await etag_says(job.src_path, info, there, self.part_size):
                        return job
                except OSError:
                    return job  # (the copy reports it)
            elif not unchanged(info, there, same_kind=same_kind, carries_date=(
                    not self.resume and carries), dates_kept=carries):
                # (--resume skips a complete file at least as new as its source, as said)
                return job
            self.outcome(FileOutcome(job.label, job.dst_label, job.info.size, "skipped",
                                     reason="unchanged"))
            return None

        kept = await asyncio.gather(*(check(j) for j in jobs))
        return [j for j in kept if j is not None]

    @staticmethod
    async def _stat_deep(job: Job) -> ObjectInfo:
        """A local destination whose whole path is past PATH_MAX, looked at a directory
        at a time as the copy wrote it (``os.stat`` of the path refuses it, and it was
        taken as missing and copied again on every sync)."""
        from ..providers.local.version import object_info
        from .local import stat_by_parts

        assert job.local is not None  # (_past_path_max: a local destination)
        root, parts = job.local
        st = await asyncio.to_thread(stat_by_parts, root, parts)
        if not stat.S_ISREG(st.st_mode):
            raise NotFoundError(f"not a regular file: {job.dst_path}", service="file")
        return object_info(job.dst_path, st)

    async def _kms_by_default(self, job: Job) -> bool:
        """Whether ``job``'s source bucket encrypts objects with SSE-KMS or DSSE-KMS by
        default (GetBucketEncryption, once a bucket): its listed objects' ETags are taken
        as no MD5s, as a HEAD would say of each (an object stored with another encryption
        named is taken so too: the dates decide for it, as for aws s3 sync). False where
        the bucket has no such default or may not be asked."""
        from ..providers.s3.etags import KMS_ENCRYPTION

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
