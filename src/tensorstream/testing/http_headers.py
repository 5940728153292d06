"""HTTP headers the test HTTP server and the HTTP fault proxy treat alike: the
credential headers hidden in a recorded request's repr (:func:`request_repr`)
and the value of a ``Retry-After`` they send (:func:`retry_after_header`)."""

from __future__ import annotations

import math
from typing import Any

from ..uri_redaction import SECRET_HEADERS

__all__ = ["request_repr", "retry_after_header"]


def retry_after_header(seconds: float) -> str:
    """``Retry-After``'s value for ``seconds``: a whole number as HTTP's delta-seconds
    (``2``; ``2.0`` made urllib3, hence requests, raise ``InvalidHeader``). A fraction,
    for quick tests, or a value that is no number at all, for tests of a client's
    handling of odd headers, is sent as given."""
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) \
            and math.isfinite(seconds) and float(seconds).is_integer():
        return str(int(seconds))
    return str(seconds)




def request_repr(record: Any) -> str:
    """``Name(method=..., path=..., headers=..., status=...)`` with credential
    headers as ``***``: a failed assertion or a print of ``backend.requests``
    must not put the test's token or password in the CI log. ``headers`` itself
    keeps them, for tests that check what was sent."""
    headers = {k: "***" if k.lower() in SECRET_HEADERS else v for k, v in record.headers.items()}
    return (f"{type(record).__name__}(method={record.method!r}, path={record.path!r}, "
            f"headers={headers!r}, status={record.status!r})")
