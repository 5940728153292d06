"""Storage options as command-line flags: one table, shared by every command.

Each flag maps to one option name in :func:`tensorstream.providers.registry.known_option_names`,
so ``--s3-endpoint URL`` means exactly ``tensorstream.open(..., s3_endpoint=URL)`` (a
scheme-less ``host:port`` is https://, as in tensorizer). ``--endpoint-url`` (aws's
name) refuses one, as the aws CLI does.
The names users already type in ``aws s3`` work too (``--endpoint-url``,
``--profile``, ``--region``, ``--no-sign-request``, ``--no-verify-ssl``), and
curl's and wget's ``--proxy URL`` / ``--no-proxy`` (the ``proxy`` option: a URL, or
``False``).
Flags not given are not passed, so the library's environment variables and
config files (``S3_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.s3cfg``...) still apply.

Storage flags are accepted before or after the subcommand (``tensorstream
--endpoint-url URL cp ...`` and ``tensorstream cp --endpoint-url URL ...``):
both parsers declare them with ``default=SUPPRESS``, so a flag the
subcommand did not see never overwrites one given before it.

Commands with two sides (``cp``, ``sync``) also take ``--src-*``/``--dst-*``
versions of the endpoint, profile, region and TLS flags, which apply to one
side only (two S3 endpoints in one command).
"""

from __future__ import annotations

import argparse
import posixpath
import textwrap
from typing import Any

from ..config import parse_byte_size
from ..errors import ConfigurationError

__all__ = ["FLAGS", "Rule", "SIDE_FLAGS", "add_side_options", "add_storage_options", "parse_size",
           "side_options", "storage_options", "unmatchable_rule"]

#: (flags, option name, type, help). ``bool`` flags are store_true.
FLAGS: list[tuple[tuple[str, ...], str, Any, str]] = [
    (("--endpoint-url",), "s3_endpoint", str,
     "S3 endpoint URL, with its scheme (http://minio:9000), as aws requires"),
    (("--region", "--s3-region"), "s3_region", str, "S3 region"),
    (("--profile", "--s3-profile"), "s3_profile", str, "profile in ~/.aws/config"),
    (("--s3-access-key-id",), "s3_access_key_id", str, "S3 access key id"),
    (("--s3-secret-access-key",), "s3_secret_access_key", str,
     "S3 secret key (prefer AWS_SECRET_ACCESS_KEY: argv is visible to others)"),
    (("--s3-session-token",), "s3_session_token", str, "S3 session token"),
    (("--s3-credential-process-timeout",), "s3_credential_process_timeout", float,
     "seconds a profile's credential_process may run before it is stopped (default 60)"),
    (("--s3-addressing-style",), "s3_addressing_style", str, "path | virtual | auto"),
    (("--no-sign-request", "--anonymous"), "anonymous", bool,
     "unsigned S3 requests (public buckets)"),
    (("--ca-bundle",), "ca_bundle", str,
     "PEM file of CA certificates to trust (HTTPS, S3, rediss)"),
    (("--no-verify-ssl", "--insecure"), "insecure", bool,
     "do NOT verify TLS certificates (warns)"),
    (("--client-cert", "--cert"), "client_cert", str,
     "TLS client certificate, PEM, for servers that require one (HTTPS, S3, rediss; "
     "curl's --cert)"),
    (("--client-key",), "client_key", str,
     "the client certificate's private key, PEM, not encrypted (when it is not in the "
     "--client-cert file; curl's --key)"),
    (("--token",), "token", str, "HTTP bearer token"),
    (("--redis-username",), "redis_username", str, "Redis ACL user name"),
    (("--redis-password",), "redis_password", str,
     "Redis password (prefer REDIS_PASSWORD: argv is visible to others)"),
    (("--redis-cluster",), "redis_cluster", bool, "connect to a Redis Cluster"),
    (("--proxy",), "proxy", str,
     "HTTP proxy for every HTTP(S) and S3 request: http://[user:password@]host:port "
     "(default: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY; prefer them for a password: "
     "argv is visible to others)"),
    (("--timeout-connect",), "timeout_connect", float, "connect timeout, seconds (default 10)"),
    (("--timeout-idle",), "timeout_idle", float,
     "max seconds without receiving a byte (default 30)"),
    (("--timeout-total",), "timeout_total", float,
     "max seconds for one read, its retries included (default none: a server trickling "
     "bytes is never idle)"),
    (("--retries",), "retries", int, "attempts per request, including the first (default 5)"),
]

_METAVARS = {"proxy": "URL", "client_cert": "PEM", "client_key": "PEM",
             "s3_credential_process_timeout": "SECONDS"}

#: Flags that also exist as ``--src-NAME`` / ``--dst-NAME`` on cp and sync.
SIDE_FLAGS: list[tuple[str, str, Any]] = [
    ("endpoint-url", "s3_endpoint", str),
    ("region", "s3_region", str),
    ("profile", "s3_profile", str),
    ("no-sign-request", "anonymous", bool),
    ("ca-bundle", "ca_bundle", str),
    ("no-verify-ssl", "insecure", bool),
    ("client-cert", "client_cert", str),
    ("client-key", "client_key", str),
    ("token", "token", str),
    ("redis-password", "redis_password", str),
]


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Add the storage flags (and ``--header``) to ``parser`` as one group."""
    group = parser.add_argument_group("storage options (before or after the command)")
    for flags, dest, typ, help_ in FLAGS:
        if typ is bool:
            group.add_argument(*flags, dest=f"opt_{dest}", action="store_true",
                               default=argparse.SUPPRESS, help=help_)
        else:
            group.add_argument(*flags, dest=f"opt_{dest}", type=typ, default=argparse.SUPPRESS,
                               metavar=_METAVARS.get(dest, dest.split("_", 1)[-1].upper()),
                               help=help_)
        if dest == "s3_endpoint":  # tensorizer's name, with tensorizer's meaning; after it
            group.add_argument("--s3-endpoint", dest="opt_s3_endpoint_tensorizer",
                               default=argparse.SUPPRESS, metavar="ENDPOINT",
                               help="S3 endpoint as tensorizer's and vLLM's s3_endpoint: "
                                    "without a scheme, https:// (minio:9000 is "
                                    "https://minio:9000)")
        if dest == "proxy":  # wget's --no-proxy (curl: --noproxy '*'); after --proxy in --help
            group.add_argument("--no-proxy", dest="opt_no_proxy", action="store_true",
                               default=argparse.SUPPRESS,
                               help="connect directly, whatever HTTPS_PROXY & co. say")
    group.add_argument("--header", dest="opt_headers", action="append",
                       default=argparse.SUPPRESS, metavar="'NAME: VALUE'",
                       help="extra HTTP header (repeatable)")


def add_side_options(parser: argparse.ArgumentParser) -> None:
    """``--src-*`` / ``--dst-*``: storage flags for one side of a copy only."""
    group = parser.add_argument_group(
        "source / destination options (override the storage options for one side)")
    for side in ("src", "dst"):
        for name, dest, typ in SIDE_FLAGS:
            flag = f"--{side}-{name}"
            if typ is bool:
                group.add_argument(flag, dest=f"{side}_{dest}", action="store_true",
                                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            else:
                group.add_argument(flag, dest=f"{side}_{dest}", type=typ,
                                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    names = ", ".join(n for n, _, _ in SIDE_FLAGS)
    group.description = "\n".join(textwrap.wrap(
        f"--src-NAME / --dst-NAME for NAME in: {names} (e.g. --src-endpoint-url "
        "http://a:9000 --dst-profile prod)", 76, initial_indent="  ", subsequent_indent="  ",
        break_on_hyphens=False))


def _proxy(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """``--proxy URL`` or ``--no-proxy`` into the ``proxy`` option (the URL is never echoed:
    it may hold a password)."""
    given = out.get("proxy")
    if getattr(args, "opt_no_proxy", False):
        if given is not None:
            raise ConfigurationError("--proxy and --no-proxy contradict each other; give one")
        out["proxy"] = False
    elif given is not None and not given.strip():
        raise ConfigurationError(
            "--proxy needs a URL, http://[user:password@]host:port; --no-proxy for none")


def _s3_endpoint(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """``--s3-endpoint`` into the ``s3_endpoint`` option as the library takes it (a
    scheme-less endpoint means https://, as in tensorizer, whose name the flag carries);
    ``--endpoint-url`` (aws's name) keeps aws's refusal of one (:func:`_check`)."""
    given = getattr(args, "opt_s3_endpoint_tensorizer", None)
    if given is None:
        return
    if out.get("s3_endpoint") is not None:
        raise ConfigurationError(
            "--endpoint-url and --s3-endpoint both name the S3 endpoint; give one")
    from ..providers.s3.endpoint import normalize_endpoint

    out["s3_endpoint"] = normalize_endpoint(given)


def _check(options: dict[str, Any], flag: str) -> dict[str, Any]:
    from ..providers.s3.endpoint import no_scheme

    endpoint = options.get("s3_endpoint")
    if endpoint is not None and (error := no_scheme(flag, endpoint)) is not None:
        raise error
    return options


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The option dict for :func:`tensorstream.get_provider` from parsed flags."""
    out: dict[str, Any] = {}
    for _flags, dest, _typ, _help in FLAGS:
        value = getattr(args, f"opt_{dest}", None)
        if value is not None:
            out[dest] = value
    headers = getattr(args, "opt_headers", None)
    if headers:
        parsed: dict[str, str] = {}
        for h in headers:
            name, sep, value = h.partition(":")
            if not sep or not name.strip():
                # never echo what was given: a mistyped header is usually a credential
                raise argparse.ArgumentTypeError(
                    "--header must be 'Name: value' (a colon after the name); the value "
                    "given is not shown")
            parsed[name.strip()] = value.strip()
        out["headers"] = parsed
    _proxy(args, out)
    _check(out, "--endpoint-url")
    _s3_endpoint(args, out)
    return out


def side_options(args: argparse.Namespace, side: str) -> dict[str, Any]:
    """Options given for one side only (``side`` is ``"src"`` or ``"dst"``)."""
    out: dict[str, Any] = {}
    for _name, dest, _typ in SIDE_FLAGS:
        value = getattr(args, f"{side}_{dest}", None)
        if value is not None:
            out[dest] = value
    return _check(out, f"--{side}-endpoint-url")


class Rule(argparse.Action):
    """--exclude/--include: one ordered list, as aws applies them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        rules = list(getattr(namespace, "rules", None) or [])
        rules.append((self.const, values))
        namespace.rules = rules


def unmatchable_rule(rules: list[tuple[str, str]], where: str) -> str | None:
    """The error for the first --exclude/--include pattern that can match no key (empty,
    or starting with '/': keys are relative to ``where``; ending with '/': keys name
    objects, never a directory; a '.', '..' or empty segment, as in './cache/*': no key
    cp copies, nor any of a local listing, has one), or that can change nothing (an
    --include before any --exclude), else None."""
    excluded = False
    for kind, pattern in rules:
        if not pattern or pattern.startswith("/"):
            return (f"--{kind} {pattern!r} matches no key: patterns match keys relative to "
                    f"{where} (e.g. 'sub/*.bin'), never empty, never starting with '/'")
        if pattern.endswith("/"):
            # `rm -r --exclude keep/` deleted everything under keep/, `sync --delete
            # --exclude cache/` the destination's cache/: the pattern matched nothing.
            return (f"--{kind} {pattern!r} matches no key: keys name objects, never a "
                    f"directory; write {pattern + '*'!r} for every key under it")
        if any(part in (".", "..", "") for part in pattern.split("/")):
            # `--exclude './cache/*'` (a path as the shell writes it) left cache/ in, and
            # `sync --delete` deleted the destination's: a key has no such segment.
            fixed = posixpath.normpath(pattern)
            hint = (f"; write {fixed!r}" if fixed != "." and ".." not in fixed.split("/")
                    else "")
            # rm lists S3 keys as stored, `p/./a` included: '[.]' still names such a one.
            stored = ("; for a stored key that has a '.' segment, write it '[.]'"
                      if where == "URI" else "")
            return (f"--{kind} {pattern!r} matches no key: keys relative to {where} have no "
                    f"'.', '..' or empty segments{hint}{stored}")
        if kind == "include" and not excluded:
            # Everything is included to begin with (aws's order), so this took nothing
            # back: s5cmd's and rclone's "only these" became "all", and `rm -r --include
            # '*.pt'` deleted every object, `sync --delete` every other file at DST.
            return (f"--include {pattern!r} before any --exclude changes nothing: everything "
                    "is included to begin with and the last rule that matches a key decides "
                    "(aws s3's order; s5cmd and rclone read --include otherwise); to take only "
                    f"these, write --exclude '*' --include {pattern!r}")
        excluded = excluded or kind == "exclude"
    return None


def parse_size(text: str) -> int:
    """``"8M"``, ``"64MiB"``, ``"1048576"`` -> bytes (binary units)."""
    n = parse_byte_size(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8M, 64MiB, 1048576)")
    if n < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return n


def add_output_options(parser: argparse.ArgumentParser, *, json_help: str) -> Any:
    """The ``output`` group that commands with a progress bar share (``--no-progress``,
    ``-q``, ``--json``); returns the group for a command's own output flags."""
    out = parser.add_argument_group("output")
    out.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar (there is none unless stderr is a terminal)")
    out.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    out.add_argument("--json", action="store_true", help=json_help)
    return out


def add_no_fsync_option(group: Any, *, target: str, moment: str = "") -> None:
    """``--no-fsync`` (``args.durable`` false) for commands that publish local files;
    ``target`` (and ``moment``) name what is published (and after what) in the help."""
    group.add_argument("--no-fsync", dest="durable", action="store_false",
                       help=f"publish {target} without waiting for the disk (no fsync): it still "
                            "appears whole or not at all to readers, but a power loss right "
                            f"after{' ' + moment if moment else ''} can leave it empty or partial")
