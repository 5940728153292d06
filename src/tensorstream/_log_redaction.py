"""Keep secrets out of third-party DEBUG logs.

botocore logs canonical requests and request headers at DEBUG, including
``X-Amz-Security-Token`` and the ``Authorization`` signature. A filter on
those loggers masks them before any handler sees the record.
"""

from __future__ import annotations

import logging
import re

from .uri import redact_text

__all__ = ["install_secret_filter"]

_PATTERNS = [
    # header dumps: 'X-Amz-Security-Token': b'...'  /  x-amz-security-token:...
    re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)([^'\"\s,}]+)"),
    re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*b?['\"]?)([^'\"}]+)"),
    re.compile(r"(?i)(signature=)([0-9a-f]{16,})"),
    re.compile(r"(?i)(aws_secret_access_key['\"]?\s*[:=]\s*['\"]?)([^'\"\s,}]+)"),
]


def _mask(text: str) -> str:
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    return redact_text(text)


class SecretFilter(logging.Filter):
    """Render the record once and mask credentials in it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # pragma: no cover - malformed third-party record
            return True
        masked = _mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_installed = False
_LOGGERS = ("botocore", "aiobotocore", "s3fs", "urllib3", "aiohttp.client")


def install_secret_filter() -> None:
    """Mask credentials in every log record of the libraries we drive (idempotent).

    A ``logging.Filter`` on a logger does not see records of its child loggers
    (``botocore.auth``, ``botocore.endpoint``, ...), so the masking hooks the
    record factory, the supported place to adjust records as they are made.
    """
    global _installed
    if _installed:
        return
    _installed = True
    flt = SecretFilter()
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.startswith(_LOGGERS):
            flt.filter(record)
        return record

    logging.setLogRecordFactory(factory)
