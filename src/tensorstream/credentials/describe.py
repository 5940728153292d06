"""``tensorstream.describe_credentials``: which source supplied each value, secrets masked.

>>> print(tensorstream.describe_credentials("s3://models/llama.tensors"))  # doctest: +SKIP
credentials for s3://models/llama.tensors
  access_key_id      ***WXYZ                  env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY
  secret_access_key  ***                      env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY
  endpoint           https://object.example   env S3_ENDPOINT_URL
  ...

Each service describes its own credentials (``describe_credentials`` in its
``providers/<service>/config.py``, or a provider's ``describe_credentials``
classmethod for third parties); the registry says which. Any other scheme gets
a generic report of the URI's userinfo and the options passed.
"""

from __future__ import annotations

import os
from typing import Any

from ..providers.registry import credential_describer
from ..uri import ParsedURI, parse_uri
from .base import is_secret_name, mask
from .report import CredentialReport, ReportLine

__all__ = ["CredentialReport", "ReportLine", "describe_credentials", "describe_generic"]


def describe_credentials(uri: str | os.PathLike[str] | ParsedURI, **options: Any) -> CredentialReport:
    """Report which source supplies each credential/config value for ``uri``.

    Secrets are masked (``***``); nothing is contacted except, for S3 keys
    left to botocore, its own chain (which may query instance metadata unless
    ``AWS_EC2_METADATA_DISABLED=true``).
    """
    parsed = parse_uri(uri)
    describe = credential_describer(parsed.scheme)
    if describe is not None:
        report = describe(parsed, options)
        if report is not None:
            return report  # type: ignore[no-any-return]
    return describe_generic(parsed, options)


def _show(name: str, value: Any) -> str:
    """``value`` for display: masked when its name looks secret (a mapping under such a
    name whole: ``auth={"user": ..., "pw": ...}``), recursively in other mappings."""
    if is_secret_name(name):
        return mask(str(value))
    if isinstance(value, dict):
        inner = ", ".join(f"{k!r}: {_show(str(k), v)}" for k, v in value.items())
        return "{" + inner + "}"
    return repr(value)


def describe_generic(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Userinfo in the URI and the options given; secret-looking names masked."""
    lines: list[ReportLine] = []
    if parsed.username:
        lines.append(ReportLine("username", parsed.username, "URI userinfo"))
    if parsed.password:
        lines.append(ReportLine("password", mask(parsed.password), "URI userinfo"))
    for name in sorted(options):
        lines.append(ReportLine(name, _show(name, options[name]), f"option {name}"))
    notes = () if lines else ("no credentials given; the backend's defaults apply",)
    return CredentialReport(parsed.redacted(), tuple(lines), notes=notes)
