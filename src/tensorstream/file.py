"""Synchronous file objects over async providers.

:class:`StreamReader` is the seekable binary file that
``tensorizer.TensorDeserializer`` consumes: a large ``readinto`` fans out
into concurrent ranged reads written straight into the caller's buffer;
small reads are served from a bounded read-ahead window. Every read is
pinned to the ETag seen at open, so a replaced object raises
:class:`~tensorstream.errors.ObjectChangedError` instead of mixing versions.

:class:`StreamWriter` is an atomic, sequential writer: the object appears
when the file is closed normally and never when it is closed after an
error, or garbage-collected without ``close()``.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import _loop
from .errors import UnsupportedOperationError
from .policy import PolicyProvider
from .providers.base import ObjectInfo, Writer
from .transfer import parallel_readinto
from .uri import ParsedURI

__all__ = ["StreamReader", "StreamWriter"]

log = logging.getLogger("tensorstream.file")

_WRITE_BUFFER = 8 << 20
_MIN_WINDOW = 64 << 10


def _as_byte_view(b: Any) -> memoryview:
    view = memoryview(b)
    if view.readonly:
        raise TypeError("readinto() needs a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class StreamReader(io.RawIOBase):
    """Seekable, read-only binary file over a provider. Thread-compatible, not thread-safe.

    Create with :func:`tensorstream.open`. ``fork()`` returns an independent
    reader of the same object version (shared connection pool), which is how
    parallel readers are fed.
    """

    def __init__(
        self,
        provider: PolicyProvider,
        uri: ParsedURI,
        info: ObjectInfo,
        *,
        owns_provider: bool = True,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._provider = provider
        self._uri = uri
        self._info = info
        self._pos = 0
        self._buf: bytes | memoryview = b""
        self._buf_start = 0
        self._owns_provider = owns_provider
        self._forks = 0
        self._fork_lock = threading.Lock()
        self._on_close = on_close
        self._pid = _loop.loop_pid()
        cfg = provider.config.transfer
        self._large_read = cfg.large_read
        self._readahead = max(1, cfg.readahead)
        # Adaptive read-ahead window: starts small (tensorizer's header reads
        # are followed by a large tensor read that goes straight to the
        # tensor's memory, so a big window would fetch and copy those bytes
        # twice) and grows while small reads keep missing it.
        self._window = min(_MIN_WINDOW, self._readahead)
        self._scratch = bytearray()  # reused window storage: no per-fill allocation

    # -- identity -------------------------------------------------------------
    @property
    def name(self) -> str:
        """The redacted URI."""
        return self._uri.redacted()

    @property
    def size(self) -> int:
        return self._info.size

    @property
    def etag(self) -> str | None:
        return self._info.etag

    @property
    def info(self) -> ObjectInfo:
        return self._info

    @property
    def mode(self) -> str:
        return "rb"

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pos={self._pos}"
        return f"<tensorstream.StreamReader {self.name!r} size={self.size} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError("StreamReader cannot be pickled; pass the URI and reopen it instead")

    # -- io.RawIOBase ---------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        self._check_closed()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_closed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._info.size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        """Read up to ``len(b)`` bytes at the current position (fewer only at EOF)."""
        self._check_closed()
        view = _as_byte_view(b)
        want = min(len(view), max(0, self._info.size - self._pos))
        if want <= 0:
            return 0
        view = view[:want]
        filled = self._copy_from_buffer(view)
        rest = view[filled:]
        if rest:
            start = self._pos + filled
            if len(rest) >= min(self._large_read, self._window):
                # Buffering gains nothing for a read the window cannot cover.
                self._fetch_into(start, rest)
                self._window = min(_MIN_WINDOW, self._readahead)
            else:
                self._fill_buffer(start, len(rest))
                filled2 = self._copy_from_buffer(rest, start)
                assert filled2 == len(rest)
        self._pos += want
        return want

    def read(self, size: int | None = -1) -> bytes:
        self._check_closed()
        if size is None or size < 0:
            size = max(0, self._info.size - self._pos)
        buf = bytearray(min(size, max(0, self._info.size - self._pos)))
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    def readall(self) -> bytes:
        return self.read(-1)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("StreamReader has no file descriptor")

    def close(self) -> None:
        if self.closed:
            return
        self._buf = b""
        self._scratch = bytearray()
        try:
            if (self._owns_provider and self._pid == _loop.loop_pid()
                    and not _loop.is_shut_down()):
                _loop.run_sync(self._provider.close())
        finally:
            super().close()
            if self._on_close is not None:
                self._on_close()

    def fork(self) -> StreamReader:
        """An independent reader of the same object version, positioned at 0."""
        self._check_closed()
        return StreamReader(self._provider, self._uri, self._info, owns_provider=False)

    # -- internals ------------------------------------------------------------
    def _check_closed(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _copy_from_buffer(self, view: memoryview, pos: int | None = None) -> int:
        pos = self._pos if pos is None else pos
        offset = pos - self._buf_start
        if not self._buf or offset < 0 or offset >= len(self._buf):
            return 0
        n = min(len(view), len(self._buf) - offset)
        view[:n] = self._buf[offset : offset + n]
        return n

    def _fetch_into(self, start: int, view: memoryview) -> None:
        _loop.run_sync(
            parallel_readinto(
                self._provider,
                self._uri.path,
                start,
                view,
                self._provider.config.transfer,
                etag=self._info.etag,
            )
        )

    def _fill_buffer(self, start: int, need: int) -> None:
        length = min(max(need, self._window), self._info.size - start)
        if len(self._scratch) < length:
            self._buf = b""
            self._scratch = bytearray(max(length, min(self._readahead, self._info.size)))
        view = memoryview(self._scratch)[:length]
        self._buf = b""  # invalid while being refilled (an error leaves it empty)
        self._fetch_into(start, view)
        self._buf = view
        self._buf_start = start
        self._window = min(self._window * 4, self._readahead)


class StreamWriter(io.RawIOBase):
    """Sequential, atomic binary writer. Create with ``tensorstream.open(uri, "wb")``.

    ``close()`` publishes the object; leaving a ``with`` block by an exception,
    calling :meth:`abort`, or dropping the file without closing it discards it.
    """

    def __init__(self, provider: PolicyProvider, uri: ParsedURI, writer: Writer) -> None:
        super().__init__()
        self._provider = provider
        self._uri = uri
        self._writer = writer
        self._pending = bytearray()
        self._written = 0
        self._aborted = False

    @property
    def name(self) -> str:
        return self._uri.redacted()

    @property
    def mode(self) -> str:
        return "wb"

    def __repr__(self) -> str:
        return f"<tensorstream.StreamWriter {self.name!r} written={self._written}>"

    def __reduce__(self) -> Any:
        raise TypeError("StreamWriter cannot be pickled")

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._written

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        raise UnsupportedOperationError("tensorstream writers are sequential (not seekable)")

    def write(self, b: Any) -> int:
        if self.closed:
            raise ValueError("write to closed file")
        view = memoryview(b).cast("B")
        self._pending += view
        self._written += len(view)
        if len(self._pending) >= _WRITE_BUFFER:
            self._flush_pending()
        return len(view)

    def _flush_pending(self) -> None:
        if self._pending:
            data, self._pending = self._pending, bytearray()
            try:
                _loop.run_sync(self._writer.write(data))
            except BaseException:
                self.abort()
                raise

    def flush(self) -> None:
        """No-op for durability: the object only appears on ``close()``."""

    def close(self) -> None:
        """Publish the object atomically (commit) and release the provider."""
        if self.closed:
            return
        try:
            if not self._aborted:
                self._flush_pending()
                _loop.run_sync(self._writer.commit())
        except BaseException:
            if not self._aborted:
                self.abort()
            raise
        finally:
            self._release()

    def abort(self) -> None:
        """Discard everything written; the destination is left untouched."""
        if self._aborted:
            return
        self._aborted = True
        self._pending = bytearray()
        try:
            _loop.run_sync(self._writer.abort())
        finally:
            self._release()

    def _release(self) -> None:
        if not self.closed:
            try:
                _loop.run_sync(self._provider.close())
            finally:
                io.RawIOBase.close(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # Never publish a half-written object from the garbage collector.
        if not self.closed and not self._aborted:
            try:
                log.warning("%s dropped without close(); discarding it", self.name)
                self.abort()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass
