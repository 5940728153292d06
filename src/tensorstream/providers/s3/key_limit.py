"""The longest key S3 stores: 1024 bytes of UTF-8.

Real S3 answers a longer key with ``KeyTooLongError`` only once a request carries it
(after a multipart upload has begun, or a listing has been walked); some stores (moto,
some S3-compatibles) take it silently, so a copy would then fail elsewhere. A write
checks here first, before a byte moves. Light on purpose: the copy planner imports it.
"""

from __future__ import annotations

import reprlib

__all__ = ["MAX_KEY_BYTES", "key_too_long"]

#: The most bytes (UTF-8) of an S3 object key.
MAX_KEY_BYTES = 1024

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = 60


def key_too_long(key: str) -> str | None:
    r"""Why S3 cannot store ``key`` (shortened and escaped, with its length and the limit),
    or None when it fits.

    >>> key_too_long("a" * 1024) is None
    True
    >>> why = key_too_long("p/\n" + "k" * 1025)
    >>> print(why[:64])
    S3 keys are at most 1024 bytes (UTF-8); 'p/\nkkkkkkkkkkkkkkkkkkk
    >>> print(why[-55:])
    is 1028 bytes: shorten the destination's prefix or name
    """
    n = len(key.encode("utf-8", "surrogatepass"))
    if n <= MAX_KEY_BYTES:
        return None
    return (f"S3 keys are at most {MAX_KEY_BYTES} bytes (UTF-8); {_SHOWN.repr(key)} is {n} "
            "bytes: shorten the destination's prefix or name")
