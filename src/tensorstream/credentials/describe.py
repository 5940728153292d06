"""``tensorstream.describe_credentials``: which source supplied each value, secrets masked.

>>> print(tensorstream.describe_credentials("s3://models/llama.tensors"))  # doctest: +SKIP
credentials for s3://models/llama.tensors
  access_key_id      ***WXYZ                  env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY
  secret_access_key  ***                      env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY
  endpoint           https://object.example   env S3_ENDPOINT_URL
  ...

Each built-in scheme is described from its own resolver (s3, http(s),
redis(s)); more plug in through :data:`DESCRIBERS` (``scheme ->
"module:function"``, the function taking ``(ParsedURI, options)`` and
returning a :class:`CredentialReport`). Any other scheme gets a generic report
of the URI's userinfo and the options passed.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

from ..uri import ParsedURI, parse_uri
from .base import Sourced, mask

__all__ = ["DESCRIBERS", "CredentialReport", "ReportLine", "describe_credentials"]

#: scheme -> "module:function" describing that scheme's credentials.
DESCRIBERS: dict[str, str] = {
    "s3": "tensorstream.credentials.describe:describe_s3",
    "http": "tensorstream.credentials.describe:describe_http",
    "https": "tensorstream.credentials.describe:describe_http",
    "redis": "tensorstream.credentials.describe:describe_redis",
    "rediss": "tensorstream.credentials.describe:describe_redis",
}

_SECRET_WORDS = ("secret", "password", "token", "key", "credential", "auth")


@dataclasses.dataclass(frozen=True)
class ReportLine:
    """One value: its name, how it is shown (masked if secret) and its source."""

    name: str
    shown: str
    source: str


@dataclasses.dataclass(frozen=True)
class CredentialReport:
    """What :func:`describe_credentials` returns; ``str()`` is a readable table.

    Holds no secret: every secret value is already masked in ``lines``.
    """

    uri: str
    lines: tuple[ReportLine, ...]
    looked_in: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def source_of(self, name: str) -> str | None:
        """The source of value ``name``, or ``None`` if it is unset."""
        for line in self.lines:
            if line.name == name:
                return None if line.source == "-" else line.source
        return None

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {line.name: {"value": line.shown, "source": line.source} for line in self.lines}

    def __str__(self) -> str:
        width = max((len(line.name) for line in self.lines), default=0)
        shown = max((len(line.shown) for line in self.lines), default=0)
        out = [f"credentials for {self.uri}"]
        out += [f"  {ln.name:<{width}}  {ln.shown:<{shown}}  {ln.source}" for ln in self.lines]
        if self.looked_in:
            out.append("  looked in: " + ", ".join(self.looked_in))
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<CredentialReport {self.uri}: {len(self.lines)} values>"


def _line(name: str, value: Sourced[Any] | None, *, shown: str | None = None) -> ReportLine:
    if value is None:
        return ReportLine(name, "<unset>", "-")
    if shown is None:
        shown = mask(str(value.value)) if value.secret else str(value.value)
    return ReportLine(name, shown, value.source)


def describe_credentials(uri: str | os.PathLike[str] | ParsedURI, **options: Any) -> CredentialReport:
    """Report which source supplies each credential/config value for ``uri``.

    Secrets are masked (``***``); nothing is contacted except, for S3 keys
    left to botocore, its own chain (which may query instance metadata unless
    ``AWS_EC2_METADATA_DISABLED=true``).
    """
    parsed = parse_uri(uri)
    target = DESCRIBERS.get(parsed.scheme)
    if target is not None:
        module, _, func = target.partition(":")
        try:
            fn = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            fn = None
        if fn is not None:
            return fn(parsed, options)  # type: ignore[no-any-return]
    return describe_generic(parsed, options)


def _show(name: str, value: Any) -> str:
    """``value`` for display: masked when its name looks secret, recursively in mappings."""
    if isinstance(value, dict):
        inner = ", ".join(f"{k!r}: {_show(str(k), v)}" for k, v in value.items())
        return "{" + inner + "}"
    if any(w in name.lower() for w in _SECRET_WORDS):
        return mask(str(value))
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


def describe_s3(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Report for ``s3://``: the precedence order of :mod:`tensorstream.providers.s3.config`."""
    from ..providers.s3.config import (
        botocore_region,
        masked_key_id,
        resolve_botocore_chain,
        resolve_s3_credentials,
    )

    creds = resolve_s3_credentials(options)
    notes: list[str] = []
    key, secret, token = creds.access_key_id, creds.secret_access_key, creds.session_token
    looked: tuple[str, ...] = ()
    if creds.anonymous:
        notes.append("anonymous=True: requests are unsigned")
    elif creds.uses_botocore_chain:
        found = resolve_botocore_chain(creds)
        if found is None:
            looked = creds.looked_in
            notes.append("no S3 credentials found; set anonymous=True for public buckets")
        else:
            key, secret, token = found
    region = creds.region or botocore_region(creds)
    lines = [
        _line("access_key_id", key, shown=masked_key_id(str(key.value)) if key else None),
        _line("secret_access_key", secret),
        _line("session_token", token),
        _line("endpoint", creds.endpoint)
        if creds.endpoint
        else ReportLine("endpoint", "<AWS default>", "botocore (endpoint_url in ~/.aws/config, else AWS)"),
        _line("region", region)
        if region
        else ReportLine("region", "<unset>", "botocore default (us-east-1)"),
        _line("addressing_style", creds.addressing_style),
        _line("profile", creds.profile),
    ]
    notes.extend(_tls_notes(options))
    return CredentialReport(parsed.redacted(), tuple(lines), looked_in=looked, notes=tuple(notes))


def _tls_notes(options: dict[str, Any]) -> tuple[str, ...]:
    if options.get("insecure"):
        return ("insecure=True: TLS certificates are not verified",)
    if options.get("ca_bundle"):
        return (f"TLS verified against ca_bundle {options['ca_bundle']}",)
    return ()


def describe_redis(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Report for ``redis://``/``rediss://`` (options > URI userinfo > REDIS_* variables)."""
    from ..providers.redis.config import resolve_redis_credentials

    creds = resolve_redis_credentials(
        parsed, username=options.get("redis_username"), password=options.get("redis_password")
    )
    lines = [
        _line("username", creds.username),
        _line("password", creds.password),
        ReportLine("tls", "yes" if parsed.scheme == "rediss" else "no", f"URI scheme {parsed.scheme}"),
    ]
    return CredentialReport(parsed.redacted(), tuple(lines), notes=_tls_notes(options))


def describe_http(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Report for ``http(s)://`` (headers/token options > URI userinfo > environment)."""
    from ..providers.http.config import resolve_http_credentials

    creds = resolve_http_credentials(
        parsed,
        token=options.get("token"),
        headers=options.get("headers"),
        ca_bundle=options.get("ca_bundle"),
        client_cert=options.get("client_cert"),
        client_key=options.get("client_key"),
        insecure=bool(options.get("insecure")),
    )
    lines = [_line("authorization", creds.authorization)]
    lines += [_line(f"header {name}", value) for name, value in creds.headers]
    lines += [
        _line("ca_bundle", creds.ca_bundle),
        _line("client_cert", creds.client_cert),
        _line("client_key", creds.client_key),
    ]
    return CredentialReport(parsed.redacted(), tuple(lines), notes=_tls_notes(options))
