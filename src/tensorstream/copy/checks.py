"""What the copy engine's destinations share about trusting what they got.

* :data:`RESUMABLE`: the failures after which a ``--resume`` copy keeps its
  partial file (an interruption or a link that gave up), as opposed to a
  verification failure or a changed source, which start over.
* :func:`stored_sha256`: a checksum the source keeps of the whole object
  (a Redis manifest), compared before anything is published.
"""

from __future__ import annotations

import asyncio

from ..errors import RetriesExhaustedError, StorageTimeoutError, TransientError
from ..providers.base import ObjectInfo

__all__ = ["RESUMABLE", "STORED_MISMATCH", "stored_sha256"]

#: Failures after which a --resume copy keeps its partial file.
RESUMABLE = (asyncio.CancelledError, KeyboardInterrupt, TransientError, StorageTimeoutError,
             RetriesExhaustedError)

STORED_MISMATCH = ("verification failed: the bytes read differ from the sha256 the source "
                   "stored (the source is damaged); nothing was published")


def stored_sha256(info: ObjectInfo) -> str | None:
    """The sha256 (hex) a source stored with the object, if any: a Redis manifest's
    ``checksum``. Only a well-formed one counts."""
    value = (info.extra or {}).get("checksum")
    if isinstance(value, str) and value.startswith("sha256:"):
        hexdigest = value[len("sha256:"):].lower()
        if len(hexdigest) == 64 and all(c in "0123456789abcdef" for c in hexdigest):
            return hexdigest
    return None
