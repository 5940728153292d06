"""Redis credentials: user name and password, each tagged with its source.

Precedence, per value (first hit wins)::

    1. options      redis_username= / redis_password=
    2. URI userinfo redis://user:password@host/key  (redis://password@host: password only)
    3. environment  REDIS_USERNAME / REDIS_PASSWORD, then redis-cli's REDISCLI_AUTH
                    (a password)

No user name means Redis's ``default`` user (``requirepass``). Values are
:class:`~tensorstream.credentials.base.Sourced` so errors can say where a
rejected password came from without printing it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from ...credentials.base import Sourced, mask
from ...credentials.report import CredentialReport, ReportLine, report_line, tls_notes
from ...uri import ParsedURI

__all__ = [
    "OPTIONS",
    "describe_credentials","RedisCredentials", "resolve_redis_credentials"]

#: Every option the Redis service accepts.
OPTIONS = frozenset({
    "redis_username", "redis_password", "redis_db", "redis_cluster", "redis_chunk_size",
    "ca_bundle", "insecure", "client_cert", "client_key",
})

ENV_USERNAME = "REDIS_USERNAME"
ENV_PASSWORD = "REDIS_PASSWORD"
#: redis-cli's password variable (``redis-cli`` reads it instead of ``-a``).
ENV_CLI_PASSWORD = "REDISCLI_AUTH"
#: Where a password is looked for, in order (for error messages).
PASSWORD_LOOKED_IN = ("option redis_password", "URI userinfo", f"env {ENV_PASSWORD}",
                      f"env {ENV_CLI_PASSWORD}")


@dataclasses.dataclass(frozen=True)
class RedisCredentials:
    """A resolved Redis user name and password (either may be ``None``)."""

    username: Sourced[str] | None = None
    password: Sourced[str] | None = None

    def __repr__(self) -> str:
        user = repr(self.username.value) if self.username else None
        pw = f"{mask(self.password.value)} from {self.password.source}" if self.password else None
        return f"RedisCredentials(username={user}, password={pw})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("refusing to pickle Redis credentials")

    def secrets(self) -> tuple[str, ...]:
        """The password, for masking where a server echoes it (never shown)."""
        return (self.password.value,) if self.password else ()

    def describe(self, *, looked_in: bool = False) -> str:
        """``user 'x' (from ...), password from ...`` -- safe for error messages;
        ``looked_in``: without a password, also where one was looked for."""
        user = (f"user {self.username.value!r} (from {self.username.source})"
                if self.username else "the default user")
        pw = f"password from {self.password.source}" if self.password else "no password"
        if looked_in and not self.password:
            pw += f" (looked in: {', '.join(PASSWORD_LOOKED_IN)})"
        return f"{user}, {pw}"


def _first(*candidates: tuple[Any, str], secret: bool) -> Sourced[str] | None:
    for value, source in candidates:
        if value is not None and value != "":
            return Sourced(str(value), source, secret=secret)
    return None


def resolve_redis_credentials(
    uri: Any,
    *,
    username: str | None = None,
    password: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RedisCredentials:
    """Resolve credentials for a parsed ``redis[s]://`` URI (see module docstring)."""
    env = os.environ if environ is None else environ
    return RedisCredentials(
        username=_first(
            (username, "option redis_username"),
            (getattr(uri, "username", None), "URI userinfo"),
            (env.get(ENV_USERNAME), f"env {ENV_USERNAME}"),
            secret=False,
        ),
        password=_first(
            (password, "option redis_password"),
            (getattr(uri, "password", None), "URI userinfo"),
            (env.get(ENV_PASSWORD), f"env {ENV_PASSWORD}"),
            (env.get(ENV_CLI_PASSWORD), f"env {ENV_CLI_PASSWORD}"),
            secret=True,
        ),
    )


def describe_credentials(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Report for ``redis://``/``rediss://`` (options > URI userinfo > REDIS_* variables >
    REDISCLI_AUTH)."""
    creds = resolve_redis_credentials(
        parsed, username=options.get("redis_username"), password=options.get("redis_password")
    )
    lines = [
        report_line("username", creds.username),
        report_line("password", creds.password),
        ReportLine("tls", "yes" if parsed.scheme == "rediss" else "no", f"URI scheme {parsed.scheme}"),
    ]
    return CredentialReport(parsed.redacted(), tuple(lines), notes=tls_notes(options))
