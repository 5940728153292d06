"""Generic adapter: any protocol fsspec knows (``gs://``, ``az://``, ``memory://``, ...)
served through one ranged-read provider.

It is the fallback for schemes without a dedicated provider; the dedicated
ones (local, HTTP, S3, Redis) are faster and stricter. fsspec filesystems
are mostly synchronous, so calls run in worker threads.

It cannot pin a read to a version (fsspec has no conditional reads), so it
does not declare ``pinned_reads``: the pinning layer checks the object with a
``stat`` before and after each read (:mod:`tensorstream.layers.pinning`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ftplib
import gc
import sys
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import fsspec

from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    InvalidRangeError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    TensorstreamError,
)
from ...readahead._memcopy import copy_into
from ...uri import redact, redact_text
from ..base import Capabilities, ObjectInfo, Pin, Provider, Writer, report_progress
from .config import OPTIONS

__all__ = ["FsspecProvider"]

#: Bytes per ``cat_file`` of a large read (progress is reported between).
_PIECE = 4 << 20


def _map_error(exc: BaseException, shown: str, quoted: dict[str, str]) -> BaseException:
    """``exc`` as tensorstream raises it. ``quoted``: the names fsspec may quote (the
    object's path and its folders', as fsspec and the provider spell them), each with
    the URI it shows instead."""
    if isinstance(exc, TensorstreamError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"not found: {shown}", service="fsspec")
    if isinstance(exc, PermissionError):
        return PermissionDeniedError(f"permission denied: {shown}", service="fsspec")
    if isinstance(exc, OSError):
        # IsADirectoryError('/u:pw@h/d'), FileExistsError of a folder that is a file: the
        # same type, naming the URI redacted
        text = str(exc)
        named = next((uri for name, uri in quoted.items() if name in text), None)
        if named is not None:
            try:
                if exc.errno is not None:
                    return type(exc)(exc.errno, exc.strerror, named)
                return type(exc)(named)
            except Exception:  # a subclass built otherwise: a plain OSError
                return OSError(exc.errno, exc.strerror or type(exc).__name__, named)
    return exc


def _etag(info: dict[str, Any]) -> str | None:
    for key in ("ETag", "etag", "md5Hash", "crc32c", "mtime", "LastModified", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return None


@contextlib.contextmanager
def _quiet_fsspec_finalizers() -> Iterator[None]:
    """Silence fsspec's own finalizers while a filesystem is made: one whose ``__init__``
    fails is finalized as the error is handled, and FTPFileSystem's ``__del__`` then raises
    AttributeError (no ``.ftp`` yet), which Python printed as 'Exception ignored in ...'
    with a traceback above the one-line refusal."""
    hook = sys.unraisablehook

    def quiet(unraisable: Any) -> None:
        if not str(getattr(unraisable.object, "__module__", "")).startswith("fsspec"):
            hook(unraisable)

    sys.unraisablehook = quiet
    try:
        yield
    finally:
        sys.unraisablehook = hook


class FsspecProvider(Provider):
    """Wraps an ``fsspec.AbstractFileSystem``; ``path`` is ``protocol://`` stripped."""

    service = "fsspec"
    capabilities: ClassVar[Capabilities] = Capabilities(write=True, list=True, delete=True)
    option_names = OPTIONS

    def __init__(self, protocol: str, storage_options: dict[str, Any] | None = None,
                 *, url: str | None = None) -> None:
        self.protocol = protocol
        #: The URL's authority, when the filesystem took its host from it (``ftp://``):
        #: fsspec's paths then leave it out, the provider's keep it (see :meth:`_fs_path`).
        self._authority: str | None = None
        self._lock: threading.Lock | None = None
        refused: TensorstreamError | None = None
        shown = redact(url) if url else f"{protocol}://"
        with _quiet_fsspec_finalizers():
            try:
                cls = fsspec.get_filesystem_class(protocol)
                # What the URL says (host, port, user, password: how fsspec.open reads
                # ``ftp://u:pw@h:21/x``); storage_options given explicitly win.
                from_url = cls._get_kwargs_from_urls(url) if url else {}
                if from_url.get("host"):
                    self._authority = urllib.parse.urlsplit(url or "").netloc
                else:  # ftp:///x: no host is refused as missing, not a connection to ''
                    from_url.pop("host", None)
                kwargs = {**from_url, **(storage_options or {})}
                if self._authority is not None:
                    # One connection per provider, its calls one at a time (the lock in
                    # _run): FTPFileSystem talks over one control connection, and parallel
                    # transfers on it failed ('150 File status okay' taken for an error).
                    # fsspec's instance cache would share it with the other side of a copy.
                    kwargs["skip_instance_cache"] = True
                self.fs = cls(**kwargs)
            except ImportError as exc:  # the protocol's package is not installed
                refused = ConfigurationError(
                    f"the {protocol}:// protocol needs a package that is not installed "
                    f"({redact_text(str(exc))})", service="fsspec")
            except (TypeError, ValueError) as exc:
                # The filesystem refused its options. A ValueError's message is left
                # out: it may quote option values (credentials among them).
                why = redact_text(str(exc)) if isinstance(exc, TypeError) else "ValueError"
                refused = ConfigurationError(
                    f"could not set up the {protocol}:// filesystem ({why}); pass "
                    f"what it needs as storage_options={{...}}", service="fsspec")
            except OSError as exc:  # a filesystem that connects as it starts (ftp://)
                refused = ConnectionFailedError(
                    f"could not connect to {shown} ({type(exc).__name__}: "
                    f"{redact_text(str(exc))})", service="fsspec")
            except Exception as exc:  # a refused login (ftplib.error_perm), anything else
                # A server's reply is shown; another message may quote option values.
                why = type(exc).__name__
                if isinstance(exc, ftplib.Error):
                    why += f": {redact_text(str(exc))}"
                refused = ConfigurationError(
                    f"could not set up the {protocol}:// filesystem for {shown} "
                    f"({why})", service="fsspec")
            if refused is None and self._authority is not None:
                self._lock = threading.Lock()
            if refused is not None:
                gc.collect()  # a failed filesystem in a reference cycle: finalized here
        if refused is not None:
            raise refused  # outside the handler: nothing of the original is chained

    def __repr__(self) -> str:
        return f"FsspecProvider({self.protocol!r})"

    def shown_path(self, path: str) -> str:
        # The path is the URI without its scheme: ``u:pw@h/x`` is only seen to hold a
        # password as ``memory://u:pw@h/x``.
        return redact(f"{self.protocol}://{path}")

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> FsspecProvider:
        options.pop("config", None)
        return cls(uri.scheme, options.get("storage_options"), url=uri.raw or None)

    def _fs_path(self, path: str) -> str:
        """The filesystem's path for the provider's (the URI without its scheme)."""
        return self.fs._strip_protocol(f"{self.protocol}://{path}")  # type: ignore[no-any-return]

    def _quoted(self, path: str) -> dict[str, str]:
        """The names an error of fsspec's may quote for ``path`` (longest first), each
        mapped to its URI, redacted: the object's and its folders'."""
        parts = path.rstrip("/").split("/")
        out: dict[str, str] = {}
        for end in range(len(parts), 0, -1):
            name = "/".join(parts[:end])
            for spelling in (self._fs_path(name), name):
                if spelling.strip("/"):  # never '/' alone: it is in every message
                    out.setdefault(spelling, self.shown_path(name))
        return out

    def _provider_path(self, name: str) -> str:
        """The provider's path for a name the filesystem listed."""
        if self._authority is None:
            return name
        return self._authority + "/" + name.lstrip("/")

    async def _run(self, path: str, fn: Any, *args: Any) -> Any:
        lock = self._lock

        def call() -> Any:
            if lock is None:
                return fn(*args)
            with lock:
                return fn(*args)

        try:
            return await asyncio.to_thread(call)
        except BaseException as exc:
            mapped = _map_error(exc, self.shown_path(path), self._quoted(path))
            if mapped is exc:
                raise
        # Raised outside the handler, nothing chained: fsspec's FileNotFoundError (and
        # IsADirectoryError...) says only the path, unredacted (``/u:pw@h/x``, no scheme
        # to recognise it by).
        raise mapped

    async def stat(self, path: str) -> ObjectInfo:
        info = await self._run(path, self.fs.info, self._fs_path(path))
        if info.get("type") == "directory":
            raise NotFoundError(f"is a directory: {self.shown_path(path)}", service="fsspec")
        return ObjectInfo(path=path, size=int(info["size"]), etag=_etag(info))

    async def readinto(
        self, path: str, offset: int, buffer: memoryview, *, pin: Pin | None = None
    ) -> int:
        # ``pin`` is never passed: pinned_reads is not declared, the layer pins.
        if offset < 0:
            raise InvalidRangeError(f"negative offset {offset}", service="fsspec")
        done = 0
        while done < len(buffer):
            piece = buffer[done : done + _PIECE]
            start = offset + done
            data = await self._run(path, self.fs.cat_file, self._fs_path(path), start,
                                   start + len(piece))
            if len(data) != len(piece):
                info = await self.stat(path)
                end = offset + len(buffer)
                if end > info.size:
                    raise InvalidRangeError(
                        f"range [{offset}, {end}) is past the end of a {info.size}-byte object",
                        service="fsspec")
                raise ObjectChangedError(
                    f"got {len(data)} bytes for a {len(piece)}-byte range: "
                    f"{self.shown_path(path)}",
                    service="fsspec")
            copy_into(piece, data)
            done += len(piece)
            report_progress()
        return done

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        found = await self._run(prefix, self.fs.find, self._fs_path(prefix), None, False, True)
        for name in sorted(found):
            info = found[name]
            if info.get("type") != "directory":
                yield ObjectInfo(path=self._provider_path(name),
                                 size=int(info.get("size") or 0), etag=_etag(info))

    def open_writer(self, path: str, **kwargs: Any) -> Writer:
        return _FsspecWriter(self, path)

    async def delete(self, path: str) -> None:
        await self.stat(path)
        await self._run(path, self.fs.rm_file, self._fs_path(path))


class _FsspecWriter(Writer):
    """Buffers to a spooled temp file, then one ``put_file``-like upload on commit.

    Atomicity is the backend's: object stores publish on upload completion.
    """

    def __init__(self, provider: FsspecProvider, path: str) -> None:
        import tempfile

        self.provider = provider
        self.path = path
        self._spool = tempfile.SpooledTemporaryFile(max_size=64 << 20)
        self._done = False

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await asyncio.to_thread(self._spool.write, data)

    async def commit(self) -> None:
        if self._done:
            return
        self._spool.seek(0)
        fs = self.provider.fs

        def upload() -> None:
            if self.provider._authority is not None:
                # A server's file tree (ftp://): the folders are made, as an object
                # store's keys need none. (Not for those: gcsfs would make a bucket.)
                parent = fs._parent(self.provider._fs_path(self.path))
                if parent not in ("", "/"):
                    fs.makedirs(parent, exist_ok=True)
            with fs.open(self.provider._fs_path(self.path), "wb") as out:
                while chunk := self._spool.read(8 << 20):
                    out.write(chunk)

        try:
            await self.provider._run(self.path, upload)
        finally:
            self._done = True
            self._spool.close()

    async def abort(self) -> None:
        self._done = True
        self._spool.close()
