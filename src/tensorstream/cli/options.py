"""Storage options as command-line flags: one table, shared by every command.

Each flag maps to one option name in :func:`tensorstream.providers.registry.known_option_names`,
so ``--s3-endpoint URL`` means exactly ``tensorstream.open(..., s3_endpoint=URL)``.
Flags not given are not passed, so the library's environment variables and
config files (``S3_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.s3cfg``...) still apply.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

__all__ = ["FLAGS", "add_storage_options", "parse_size", "storage_options"]

#: (flag, option name, type, help). ``bool`` flags are store_true.
FLAGS: list[tuple[str, str, Any, str]] = [
    ("--s3-endpoint", "s3_endpoint", str, "S3 endpoint URL (S3-compatible stores)"),
    ("--s3-region", "s3_region", str, "S3 region"),
    ("--s3-access-key-id", "s3_access_key_id", str, "S3 access key id"),
    ("--s3-secret-access-key", "s3_secret_access_key", str,
     "S3 secret key (prefer S3_SECRET_ACCESS_KEY / AWS_SECRET_ACCESS_KEY: argv is visible to others)"),
    ("--s3-session-token", "s3_session_token", str, "S3 session token"),
    ("--s3-addressing-style", "s3_addressing_style", str, "path | virtual | auto"),
    ("--s3-profile", "s3_profile", str, "profile in ~/.aws/config"),
    ("--anonymous", "anonymous", bool, "unsigned S3 requests (public buckets)"),
    ("--ca-bundle", "ca_bundle", str, "PEM file of CA certificates to trust (HTTPS, S3, rediss)"),
    ("--insecure", "insecure", bool, "do NOT verify TLS certificates (warns)"),
    ("--token", "token", str, "HTTP bearer token"),
    ("--redis-username", "redis_username", str, "Redis ACL user name"),
    ("--redis-password", "redis_password", str,
     "Redis password (prefer REDIS_PASSWORD: argv is visible to others)"),
    ("--redis-cluster", "redis_cluster", bool, "connect to a Redis Cluster"),
    ("--timeout-connect", "timeout_connect", float, "connect timeout, seconds (default 10)"),
    ("--timeout-idle", "timeout_idle", float,
     "max seconds without receiving a byte (default 30)"),
    ("--retries", "retries", int, "attempts per request, including the first (default 5)"),
]


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Add the storage flags (and ``--header``) to ``parser`` as one group."""
    group = parser.add_argument_group("storage options")
    for flag, dest, typ, help_ in FLAGS:
        if typ is bool:
            group.add_argument(flag, dest=f"opt_{dest}", action="store_true", default=None,
                               help=help_)
        else:
            group.add_argument(flag, dest=f"opt_{dest}", type=typ, default=None,
                               metavar=dest.split("_", 1)[-1].upper(), help=help_)
    group.add_argument("--header", dest="opt_headers", action="append", default=None,
                       metavar="'NAME: VALUE'", help="extra HTTP header (repeatable)")


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The option dict for :func:`tensorstream.get_provider` from parsed flags."""
    out: dict[str, Any] = {}
    for _flag, dest, _typ, _help in FLAGS:
        value = getattr(args, f"opt_{dest}", None)
        if value is not None:
            out[dest] = value
    headers = getattr(args, "opt_headers", None)
    if headers:
        parsed: dict[str, str] = {}
        for h in headers:
            name, sep, value = h.partition(":")
            if not sep or not name.strip():
                raise argparse.ArgumentTypeError(f"--header must be 'Name: value', got {name!r}")
            parsed[name.strip()] = value.strip()
        out["headers"] = parsed
    return out


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"8M"``, ``"64MiB"``, ``"1048576"`` -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8M, 64MiB, 1048576)")
    n = float(m.group(1)) * (1 << (10 * " kmgt".index((m.group(2) or " ").lower())))
    if n < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return int(n)
