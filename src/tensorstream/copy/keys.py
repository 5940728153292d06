"""Safe mapping of object keys to destination paths.

A recursive copy turns keys listed under a source prefix into paths under a
destination. Keys come from remote listings and are untrusted: ``../x``,
``/abs``, ``a//b`` or ``a/./b`` must never make ``cp`` write outside its
destination. This module decides, without touching the filesystem, which
keys are safe (:func:`safe_relative_key`), and plans a whole listing
deterministically (:func:`plan_keys`): directory-marker keys (``dir/``) are
skipped, and a key that is also a "directory" of another key (``a`` and
``a/b``) is reported as a conflict when the destination is a filesystem.

:func:`open_dir_under` then opens the destination directory for a safe key
component by component with ``O_NOFOLLOW``, so a symlink planted inside the
destination is never followed.
"""

from __future__ import annotations

import dataclasses
import errno
import os

__all__ = [
    "NAME_MAX",
    "KeyPlan",
    "UnsafeKeyError",
    "folder_base",
    "is_temp_name",
    "open_dir_under",
    "plan_keys",
    "relative_key",
    "safe_relative_key",
]


#: The longest file name (bytes) a local filesystem takes.
NAME_MAX = 255


class UnsafeKeyError(ValueError):
    """A key cannot be mapped to a path inside the destination."""


def safe_relative_key(key: str, *, filesystem: bool = True) -> str:
    r"""Validate a key relative to the source prefix and return it unchanged.

    Rejected wherever the key lands, since it would name another place (a path
    joins its segments, URL handling folds ``..``): empty keys, absolute keys
    (``/x``), empty segments (``a//b``), ``.`` and ``..`` segments. Directory
    markers (``dir/``) are not objects and are rejected too; :func:`plan_keys`
    reports them as skipped. Into a filesystem (``filesystem=True``) also
    backslashes (a path separator elsewhere), NUL and other control characters;
    S3 and Redis keep such keys as they are (``filesystem=False``).

    >>> safe_relative_key("model/part-0.bin")
    'model/part-0.bin'
    >>> safe_relative_key("../etc/passwd")
    Traceback (most recent call last):
    ...
    tensorstream.copy.keys.UnsafeKeyError: key '../etc/passwd' has a '..' segment
    >>> safe_relative_key("win\\w.bin", filesystem=False)
    'win\\w.bin'
    """
    if not key:
        raise UnsafeKeyError("empty key")
    if filesystem and any(ord(c) < 0x20 or c == "\x7f" for c in key):
        raise UnsafeKeyError(f"key {key!r} contains control characters")
    if filesystem and "\\" in key:
        raise UnsafeKeyError(f"key {key!r} contains a backslash")
    if key.startswith("/"):
        raise UnsafeKeyError(f"key {key!r} is absolute")
    if key.endswith("/"):
        raise UnsafeKeyError(f"key {key!r} is a directory marker")
    for seg in key.split("/"):
        if seg == "":
            raise UnsafeKeyError(f"key {key!r} has an empty segment")
        if seg == "..":
            raise UnsafeKeyError(f"key {key!r} has a '..' segment")
        if seg == ".":
            raise UnsafeKeyError(f"key {key!r} has a '.' segment")
    return key


def folder_base(path: str) -> str:
    """The prefix that a remote destination folder's keys go under: its path less one
    trailing ``/``, a ``//`` kept (``s3://b/p//`` puts ``p//a``, as ``aws s3 cp -r`` does
    and as ``cp a s3://b/p//`` does); a root (``redis://h/``) is ``""``.

    >>> folder_base("b/p//"), folder_base("b/p/"), folder_base("b/p"), folder_base("/")
    ('b/p/', 'b/p', 'b/p', '')
    """
    if not path.strip("/"):
        return ""
    return path[:-1] if path.endswith("/") else path


def is_temp_name(name: str) -> bool:
    """Whether a file name is one ``cp`` keeps beside a local destination while it
    writes (``.NAME.tensorstream-*.tmp``: temp files, resume journals), which a
    later copy into that directory removes or reads as its own."""
    return name.startswith(".") and ".tensorstream-" in name and name.endswith(".tmp")


def relative_key(path: str, base: str) -> str | None:
    """``path`` relative to ``base`` (a prefix ending in ``/``), or None if outside it.

    Comparing with the trailing ``/`` keeps ``data-evil/x`` out of ``data/``.
    """
    if base and not base.endswith("/"):
        raise ValueError("base must be empty or end with '/'")
    if not path.startswith(base):
        return None
    return path[len(base):]


@dataclasses.dataclass
class KeyPlan:
    """Result of :func:`plan_keys`: what to copy and what was refused, in key order."""

    #: ``(original key, safe relative key)`` pairs to copy.
    copy: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: ``(key, reason)`` for keys refused as unsafe or conflicting (errors).
    refused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: ``(key, reason)`` for keys skipped on purpose (directory markers).
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def plan_keys(keys: list[str], *, filesystem: bool) -> KeyPlan:
    """Decide, deterministically, which relative keys to copy.

    The result depends only on the *set* of keys, never on listing order.
    With ``filesystem=True`` a key that is a path prefix of another key
    (``a`` beside ``a/b``) cannot be both a file and a directory: the
    deeper keys win and ``a`` is refused as a conflict; a key with a
    segment longer than :data:`NAME_MAX` bytes, or named like ``cp``'s own
    temp files (:func:`is_temp_name`), is refused too.
    """
    plan = KeyPlan()
    safe: list[tuple[str, str]] = []
    for key in sorted(set(keys)):
        if key.endswith("/") and key.strip("/"):
            try:
                safe_relative_key(key.rstrip("/"), filesystem=filesystem)
            except UnsafeKeyError as exc:
                plan.refused.append((key, str(exc)))
            else:
                plan.skipped.append((key, "directory marker"))
            continue
        try:
            safe.append((key, safe_relative_key(key, filesystem=filesystem)))
        except UnsafeKeyError as exc:
            plan.refused.append((key, str(exc)))
    if filesystem:
        dirs: set[str] = set()
        for _, rel in safe:
            parts = rel.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
        for key, rel in safe:
            if rel in dirs:
                plan.refused.append((key, f"key {key!r} is also a directory of other keys"))
            elif any(len(os.fsencode(seg)) > NAME_MAX for seg in rel.split("/")):
                plan.refused.append((key, f"key {key!r} has a segment longer than {NAME_MAX} "
                                          "bytes, the longest name a directory takes"))
            elif is_temp_name(rel.rsplit("/", 1)[-1]):
                plan.refused.append((key, f"key {key!r} has the name of a tensorstream temp "
                                          "file (a later copy there would remove it)"))
            else:
                plan.copy.append((key, rel))
        plan.refused.sort()
    else:
        plan.copy = safe
    return plan


def open_dir_under(root_fd: int, parts: list[str], *, create: bool = True) -> int:
    """Open (creating if asked) directory ``root/parts...`` without following symlinks.

    Each component is opened relative to its parent's descriptor with
    ``O_NOFOLLOW | O_DIRECTORY``, so a symlink (or a file) in the way raises
    :class:`UnsafeKeyError` instead of redirecting the write. Returns a new
    descriptor the caller must close.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise UnsafeKeyError(f"unsafe path component {part!r}")
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/".join(parts[: i + 1])
                    raise UnsafeKeyError(
                        f"{where!r} in the destination is a symlink or a file, not a directory"
                    ) from exc
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise
