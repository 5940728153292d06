"""The version of an object a read is pinned to (:class:`Pin`), and the one check
that an answer is of it: never a mix of versions."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING

from ..errors import ObjectChangedError
from ..uri import redact_text

if TYPE_CHECKING:  # pragma: no cover
    from .base import ObjectInfo

__all__ = ["Pin"]


@dataclasses.dataclass(frozen=True)
class Pin:
    """The version of an object that a read is pinned to (from a ``stat``).

    Every answer of a pinned read must be of this version: same ETag where
    the backend gives one, else same Last-Modified (``mtime``), and always
    the same total ``size``. ``None`` fields are unknown and not compared.
    """

    size: int | None = None
    etag: str | None = None
    mtime: datetime | None = None

    @classmethod
    def of(cls, info: ObjectInfo) -> Pin:
        """The pin of what :meth:`Provider.stat` reported."""
        return cls(size=info.size, etag=info.etag, mtime=info.mtime)

    @property
    def validated(self) -> bool:
        """Whether a change can be told apart from no change by more than the
        size (an ETag or a Last-Modified is known)."""
        return self.etag is not None or self.mtime is not None

    def check(self, served: Pin, *, service: str | None = None,
              path: str | None = None, confirming: bool = False) -> None:
        """Raise :class:`ObjectChangedError` when ``served`` (what an answer or a
        later ``stat`` reported) is not this version. Fields unknown on either
        side are not compared, except with ``confirming``: ``served`` is then
        the check that stands in for an answer that named no version, so one
        that no longer reports the validator this pin holds (the ETag, or the
        Last-Modified) cannot confirm it and is a change too.

        A strong ETag known on both sides decides alone; a weak one (``W/``)
        only says the two are equivalent, not byte for byte the same, so the
        Last-Modified is compared as well where both sides know it. A weak and
        a strong ETag of the same value are the same version only if both
        sides' Last-Modified dates are known and equal."""
        why = None
        if self.size is not None and served.size is not None and served.size != self.size:
            why = f"size {served.size}, was {self.size}"
            if (self.etag is not None and served.etag is not None
                    and not (_weak(self.etag) or _weak(served.etag))
                    and served.etag.strip() == self.etag.strip()):
                # One strong ETag names one sequence of bytes: the server contradicts
                # itself (a HEAD that reports another length than its GETs serve).
                why += (f", under the same ETag {served.etag}: the server's answers disagree "
                        "on the size (its HEAD and its GETs?), not only the object changed")
        elif self.etag is not None and served.etag is not None and (
                _opaque(served.etag) != _opaque(self.etag)):
            why = f"ETag {served.etag}, was {self.etag}"
        elif (self.etag is not None and served.etag is not None
              and not (_weak(self.etag) or _weak(served.etag))):
            pass  # equal strong ETags: the same bytes, whatever the dates say
        elif (self.mtime is not None and served.mtime is not None
              and served.mtime != self.mtime):
            why = f"Last-Modified {served.mtime:%Y-%m-%d %H:%M:%S}, was {self.mtime:%Y-%m-%d %H:%M:%S}"
        elif (self.etag is not None and served.etag is not None
              and _weak(self.etag) != _weak(served.etag)
              and (self.mtime is None or served.mtime is None)):
            # Strong comparison fails: a server honouring If-Match would have
            # refused, so this is another representation unless the dates agree.
            why = f"ETag {served.etag}, was {self.etag}, and no dates to compare"
        elif confirming and not _comparable(self, served):
            why = "the server no longer reports the validator it reported before"
        if why is not None:
            raise ObjectChangedError(f"the object changed while it was being read ({why})",
                                     service=service, path=redact_text(path) if path else None)


def _comparable(pin: Pin, served: Pin) -> bool:
    """Whether ``served`` carries a validator ``pin`` can be compared with
    (trivially so when ``pin`` holds none)."""
    if pin.etag is None and pin.mtime is None:
        return True
    return ((pin.etag is not None and served.etag is not None)
            or (pin.mtime is not None and served.mtime is not None))


def _weak(etag: str) -> bool:
    return etag.strip().startswith("W/")


def _opaque(etag: str) -> str:
    etag = etag.strip()
    return etag[2:] if etag.startswith("W/") else etag
