"""The file tensorizer reads from, checked against the object it comes from.

Split out of :mod:`.hook` (which re-exports :class:`CheckedSource`): every
read of a tensorizer load passes through here, so this is also where an
in-place load (:mod:`.inplace`) learns which tensor comes next.
"""

from __future__ import annotations

import io
import os
import struct
from typing import Any

import numpy
from tensorizer.serialization import OPAQUE_DTYPE_SEP, _TensorHeaderDeserializer

from ..errors import MalformedFileError, ObjectChangedError
from ..file import StreamReader
from ..providers.local.version import _etag, version_change
from ..uri import redact_text
from . import inplace

__all__ = ["CheckedSource"]


#: How tensorizer writes the length that starts each tensor's header.
_HEADER_LEN = _TensorHeaderDeserializer.header_len_segment
# Where an index entry ends: its tensor's header offset, data offset and data length.
_ENTRY_LOCATION = struct.Struct("<QQQ")
#: What tensorizer's parsers raise on bytes that are not a valid file.
_PARSE_ERRORS = (struct.error, ValueError, TypeError, IndexError, OverflowError,
                 AssertionError, EOFError, UnicodeDecodeError)


class CheckedSource(io.RawIOBase):
    """The file tensorizer reads from, with every read checked against the object.

    tensorizer trusts the file: it ignores the count ``readinto`` returns (a
    truncated file loads with the tail of its last tensor left as whatever the
    fresh memory held: zeros) and allocates whatever a length field claims
    before reading it. Here every ``read``/``readinto`` must lie inside the
    object's ``size`` and be filled completely, and once the index is known
    (:meth:`set_index`) each tensor header's length must match it, so a
    damaged file raises :class:`MalformedFileError` before any memory is
    allocated for it or any tensor is handed out.
    """

    def __init__(self, inner: Any, size: int, name: str) -> None:
        super().__init__()
        self.inner = inner
        self.size = size
        self.name = name
        self._headers: dict[int, int] = {}
        #: every tensor of the whole index (filtered out or not), by its header's offset
        self._entries: dict[int, Any] = {}
        # The inner file's position, kept here (None: ask it): every read asks for
        # it, and an OS file answers each tell() with a system call.
        self._pos: int | None = None
        #: A plain OS file's version (the local provider's ETag of it) when it was
        #: wrapped: every read checks it after (:meth:`unchanged`). None: the inner
        #: reader pins its own version (a StreamReader) or has none (BytesIO).
        self.identity: str | None = None

    @classmethod
    def wrap(cls, source: Any) -> Any:
        """``source`` behind the checks; unchanged if its size cannot be known."""
        if isinstance(source, StreamReader):
            return cls(source, source.size, source.name)
        name = redact_text(str(getattr(source, "name", "<file>")))
        identity = None
        try:
            st = os.fstat(source.fileno())
            size, identity = st.st_size, _etag(st)
        except (AttributeError, OSError, io.UnsupportedOperation):
            try:  # another seekable file object (BytesIO...)
                pos = source.tell()
                size = source.seek(0, io.SEEK_END)
                source.seek(pos)
            except (AttributeError, OSError, io.UnsupportedOperation):
                return source
        out = cls(source, int(size), name)
        out.identity = identity
        return out

    def child(self, inner: Any) -> CheckedSource:
        """The same checks for a reopened reader of the same object."""
        out = CheckedSource(inner, self.size, self.name)
        out._headers = self._headers
        out._entries = self._entries
        out.identity = self.identity
        return out

    def unchanged(self) -> None:
        """Raise :class:`ObjectChangedError` if the plain OS file read here is no
        longer the version it was when wrapped. A local file rewritten in place
        while tensorizer read it (its headers, its tensors on a GPU or lazily)
        loaded tensors from both versions: nothing compared the file with itself."""
        if self.identity is None:
            return
        why = version_change(os.fstat(self.inner.fileno()), self.identity)
        if why is not None:
            raise ObjectChangedError(f"file changed while it was being read: {self.name} "
                                     f"({why}); load it again", service="file")

    def malformed(self, reason: str, *, expected: int | None = None) -> MalformedFileError:
        return MalformedFileError(
            f"{self.name} is not a whole tensorizer file: {reason} "
            f"(the object is {self.size} bytes)",
            expected_size=expected, actual_size=self.size)

    def set_index(self, entries: Any) -> None:
        """Check the parsed index against the object's size; remember where
        each tensor's header starts and how long it must be."""
        headers: dict[int, int] = {}
        need = 0
        for entry in entries:
            if not 0 <= entry.offset <= entry.data_offset or entry.data_length < 0:
                raise self.malformed(
                    f"its index places a tensor at impossible offsets "
                    f"(header {entry.offset}, data {entry.data_offset}+{entry.data_length})")
            if entry.data_length:  # (0: a meta tensor, zeros of its shape)
                self._check_size(entry)
            need = max(need, entry.data_offset + entry.data_length)
            headers[entry.offset] = entry.data_offset - entry.offset
        if need > self.size:
            raise self.malformed(
                f"its index needs {need} bytes, {need - self.size} more than there are "
                "(truncated or damaged)", expected=need)
        self._headers = headers

    def _check_size(self, entry: Any) -> None:
        # tensorizer reads data_length bytes and views them as dtype x shape: more bytes
        # than the shape holds were dropped silently, fewer were a bare TypeError.
        try:
            itemsize = numpy.dtype(str(entry.dtype).split(OPAQUE_DTYPE_SEP, 1)[0]).itemsize
        except (TypeError, ValueError):
            raise self.malformed(f"its index gives tensor {entry.name} the unknown dtype "
                                 f"{entry.dtype!r}") from None
        count = 1
        for d in entry.shape:
            count *= d
            if count * itemsize > entry.data_length:  # a huge shape: stop multiplying
                break
        if count * itemsize != entry.data_length:
            raise self.malformed(
                f"its index gives tensor {entry.name} shape {tuple(entry.shape)} x "
                f"{entry.dtype}, which is not its {entry.data_length} bytes of data")

    def check_count(self, entries: list[Any], count: int, index: bytes) -> None:
        """Check that the file header's tensor ``count`` names every entry of
        the ``index`` bytes, whose whole parse (no filter) is ``entries``."""
        # tensorizer parses exactly `count` entries and zero-fills the index space its
        # entries leave: a count lowered by damage would silently drop the later tensors.
        if len(entries) != count:
            raise self.malformed(f"its index names {count - len(entries)} of its "
                                 f"{count} tensors twice")
        self._entries = {entry.offset: entry for entry in entries}
        if not entries:
            return
        last = entries[-1]
        at = index.rfind(_ENTRY_LOCATION.pack(last.offset, last.data_offset, last.data_length))
        end = at + _ENTRY_LOCATION.size
        if at < 0 or index.count(0, end) != len(index) - end:
            raise self.malformed(f"its index holds more entries than the {count} tensors "
                                 "its file header counts (a damaged tensor count)")

    def check_header(self, pos: int, header: Any) -> None:
        """Check the tensor header tensorizer parsed at ``pos`` against the index.

        tensorizer builds each tensor from its own header (name, dtype, shape) but sizes
        its memory from the index: a damaged shape loaded part of the data under another
        shape, silently; a damaged name loaded one tensor's bytes as another's."""
        if not self._entries:
            return
        entry = self._entries.get(pos)
        if entry is None:
            raise self.malformed(f"a tensor header at offset {pos}, where its index has none")
        for field in ("name", "dtype", "shape", "data_length"):
            got, want = getattr(header, field), getattr(entry, field)
            if field == "shape":
                got, want = tuple(got), tuple(want)
            if got != want:
                raise self.malformed(f"the tensor header at offset {pos} says {field} "
                                     f"{got!r}, its index says {want!r}")

    # -- io ---------------------------------------------------------------------
    def _check(self, pos: int, n: int) -> None:
        if n > self.size - pos:
            raise self.malformed(
                f"a read of {n} bytes at offset {pos} runs past the end "
                "(truncated, or a length field is damaged)", expected=pos + n)

    def _tell(self) -> int:
        pos = self._pos
        if pos is None:
            pos = self._pos = int(self.inner.tell())
        return pos

    def read(self, size: int | None = -1) -> bytes:
        pos = self._tell()
        self._pos = None  # unknown until this read has ended well
        if size is None or size < 0:
            size = max(0, self.size - pos)
        self._check(pos, size)
        run = inplace.run_for(self)
        if run is not None:
            run.before_read(self.inner, pos, size)
        want = self._headers.get(pos)
        if want is not None and size == _HEADER_LEN.size and run is not None:
            run.arm(pos)  # the next tensor tensorizer allocates is this one
        if run is not None and run.detached():  # other threads read the stream: never move it
            buf = bytearray(size)
            if size and not run.received(pos, memoryview(buf)):
                self.inner.read_ranges([(pos, buf)])
            data = bytes(buf)
        else:
            data = self.inner.read(size)
        self.unchanged()  # (a short read of a file changed meanwhile: said as a change)
        if len(data) != size:
            raise self.malformed(f"only {len(data)} of {size} bytes at offset {pos}",
                                 expected=pos + size)
        self._pos = pos + size
        if want is not None and size == _HEADER_LEN.size:
            claimed = _HEADER_LEN.unpack(data)[0]
            if claimed != want:  # tensorizer would allocate `claimed` bytes next
                raise self.malformed(
                    f"the tensor header at offset {pos} claims {claimed} bytes, "
                    f"its index says {want}")
        return bytes(data)

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        pos = self._tell()
        self._pos = None  # unknown until this read has ended well
        self._check(pos, len(view))
        run = inplace.run_for(self)
        detached = run is not None and run.detached()
        if run is not None and run.received(pos, view):  # other threads filled it
            if not detached:
                self.inner.seek(pos + len(view))
            self._pos = pos + len(view)
            return len(view)
        if detached:  # other threads read the stream: never move it
            if len(view):
                self.inner.read_ranges([(pos, view)])
            self._pos = pos + len(view)
            return len(view)
        if run is not None:
            run.before_read(self.inner, pos, len(view))
        done = 0
        while done < len(view):  # a plain file may return less at a time (2 GiB)
            n = self.inner.readinto(view[done:])
            if not n:
                self.unchanged()
                raise self.malformed(
                    f"the object ended at offset {pos + done}, {len(view) - done} bytes "
                    "short (truncated while loading?)", expected=pos + len(view))
            done += n
        self.unchanged()
        self._pos = pos + done
        return done

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else None
        if whence == io.SEEK_CUR:
            target = self._tell() + offset
        if target is not None and not 0 <= target <= self.size:
            raise self.malformed(f"a seek to offset {target} lies outside the object",
                                 expected=target)
        run = inplace.run_for(self)
        if run is not None and run.detached():  # other threads read the stream: only ours moves
            if whence == io.SEEK_END:
                target = self.size + offset
            if target is None or not 0 <= target <= self.size:
                raise self.malformed(f"a seek to offset {target} lies outside the object",
                                     expected=target)
            self._pos = target
            return target
        self._pos = None
        pos = self._pos = int(self.inner.seek(offset, whence))
        return pos

    def tell(self) -> int:
        return self._tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self.inner.fileno())

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            super().close()

    @property
    def closed(self) -> bool:
        return bool(self.inner.closed)

    def __getattr__(self, name: str) -> Any:
        # capabilities, bytes_read... of the wrapped reader; its own read1 and the
        # like move it without this object seeing: ask it for its position again.
        self.__dict__["_pos"] = None
        return getattr(self.__dict__["inner"], name)
