"""An atomic, sequential writer over an async provider's :class:`~tensorstream.providers.base.Writer`
(``tensorstream.open(uri, "wb")``)."""

from __future__ import annotations

import io
import logging
import os
import threading
from types import TracebackType
from typing import Any

from . import _loop
from .errors import UnsupportedOperationError
from .layers.stack import PolicyProvider
from .providers.base import Writer
from .uri import ParsedURI

__all__ = ["StreamWriter"]

log = logging.getLogger("tensorstream.file")

_WRITE_BUFFER = 8 << 20


class StreamWriter(io.RawIOBase):
    """Sequential, atomic binary writer. Create with ``tensorstream.open(uri, "wb")``.

    ``close()`` publishes the object; leaving a ``with`` block by an exception,
    calling :meth:`abort`, or dropping the file without closing it discards it.

    A writer belongs to the process that opened it. After ``os.fork()`` the
    child's copy cannot write or publish (:class:`UnsupportedOperationError`);
    its ``abort()``, a ``with`` block left by an exception, or dropping it only
    let go of the copy: the parent's object is neither published nor discarded.

    Safe to share between threads, as ``builtins.open(..., "wb")`` is: each
    ``write`` call's bytes land together, in the order the calls took the lock.
    """

    def __init__(self, provider: PolicyProvider, uri: ParsedURI, writer: Writer) -> None:
        super().__init__()
        self._provider = provider
        self._uri = uri
        self._writer = writer
        self._pending = bytearray()
        self._written = 0
        self._aborted = False
        self._pid = os.getpid()
        # One write, flush, close or abort at a time: two flushes in the provider at
        # once interleaved their bytes (S3 parts, Redis chunks filled from both).
        self._lock = threading.RLock()

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

    # As io's files, a closed file answers nothing but ``closed`` (ValueError).
    def writable(self) -> bool:
        self._check_closed()
        return True

    def readable(self) -> bool:
        self._check_closed()
        return False

    def seekable(self) -> bool:
        self._check_closed()
        return False

    def tell(self) -> int:
        self._check_closed()
        return self._written

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        raise UnsupportedOperationError("tensorstream writers are sequential (not seekable)")

    def readinto(self, b: Any) -> int:
        raise UnsupportedOperationError("not readable: open the URI with mode 'rb' to read")

    def write(self, b: Any) -> int:
        self._check_process("write")  # (before the lock: a parent's thread may hold it)
        with self._lock:
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
        self._check_closed()

    def _check_closed(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _inherited(self) -> bool:
        """True in a child forked after the open: the temp file, upload or staged
        chunks, and the provider's connections, are the parent's. Used from
        here they published a half-written object, or deleted the parent's."""
        return self._pid != os.getpid()

    def _check_process(self, what: str) -> None:
        if self._inherited():
            raise UnsupportedOperationError(
                f"cannot {what} {self.name}: its writer was opened by process {self._pid} "
                f"and this is process {os.getpid()}, forked after the open; the object is "
                "the opener's to write and publish (open a writer of its own here)")

    def _let_go(self) -> None:
        """Drop a forked child's copy without touching the parent's object."""
        self._aborted = True
        self._pending = bytearray()
        io.RawIOBase.close(self)

    def close(self) -> None:
        """Publish the object atomically (commit) and release the provider."""
        if self.closed:
            return
        if self._inherited():
            self._let_go()
            self._check_process("publish")
        with self._lock:
            if self.closed:  # closed by another thread meanwhile
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
        if self._inherited():
            self._let_go()
            return
        with self._lock:
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
        if self._inherited():
            self._aborted = True  # the parent's object: nothing to discard from here
        elif not self.closed and not self._aborted:
            try:
                log.warning("%s dropped without close(); discarding it", self.name)
                if _loop.in_loop_thread():
                    self._abort_soon()
                else:
                    self.abort()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

    def _abort_soon(self) -> None:
        """:meth:`abort` for the garbage collector's finalizer on the I/O thread, where
        waiting for the loop would deadlock (``run_sync`` refuses): the discard and the
        provider's close run on the loop once the finalizer returns. (Raised unseen
        before, it left a staged upload, temp file or chunks behind.)"""
        self._aborted = True
        self._pending = bytearray()
        writer, provider = self._writer, self._provider

        async def discard() -> None:
            try:
                await writer.abort()
            finally:
                await provider.close()

        _loop.run_soon(discard())
        io.RawIOBase.close(self)
