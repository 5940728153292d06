"""S3 credential and endpoint resolution, every value tagged with its source.

One precedence order, highest first (the table in ``docs/s3.md``):

1. explicit options: ``s3_access_key_id``/``s3_secret_access_key``/``s3_session_token``,
   ``s3_endpoint``, ``s3_region``, ``s3_profile``;
2. ``S3_ACCESS_KEY_ID``/``S3_SECRET_ACCESS_KEY``, ``S3_ENDPOINT_URL`` (vLLM/tensorizer names);
3. ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
   ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``,
   ``AWS_PROFILE``;
4. ``~/.s3cfg`` (s3cmd format; path set by ``s3_config_path``);
5. ``~/.aws/credentials`` and ``~/.aws/config`` profiles, then the rest of botocore's
   chain (web identity, container, instance metadata).

Levels 1-4 are read here, without I/O beyond small files. Level 5 is botocore's
own chain, run by the provider (asynchronously, with refresh) or by
:func:`~.chain.resolve_botocore_chain` (synchronously, for ``describe_credentials``).

A key pair is taken whole from one source; half of a pair is an error that
names both halves. A session token belongs to the pair of its own source.
``~/.s3cfg``'s endpoint travels only with its keys, and they with it (below
``s3_endpoint`` and ``S3_ENDPOINT_URL``): keys from elsewhere were sent to
another tool's store.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...credentials.base import Sourced, mask
from ...errors import ConfigurationError, TensorstreamError
from ...uri import ParsedURI, redact
from .endpoint import (
    check_endpoint,
    env_text,
    normalize_endpoint,
    option_text,
    read_s3cfg,
    resolve_endpoint,
    resolve_region,
    resolve_style,
)
from .process import DEFAULT_CREDENTIAL_PROCESS_TIMEOUT
from .profile import (
    NO_CREDENTIALS_ADVICE,
    aws_file,
    ignore_configured_endpoints,
    read_profile_config,
    unreadable,
)

if TYPE_CHECKING:
    from ...credentials.report import CredentialReport

__all__ = [
    "OPTIONS",
    "describe_credentials",
    "S3_CREDENTIAL_OPTIONS",
    "S3Credentials",
    "normalize_endpoint",
    "half_pair_in_aws_files",
    "no_credentials_error",
    "resolve_s3_credentials",
]

#: Options read by :func:`resolve_s3_credentials`.
S3_CREDENTIAL_OPTIONS = frozenset(
    {
        "s3_access_key_id",
        "s3_secret_access_key",
        "s3_session_token",
        "s3_endpoint",
        "s3_region",
        "s3_addressing_style",
        "s3_config_path",
        "s3_profile",
        "s3_credential_process_timeout",
        "anonymous",
    }
)
CHAIN_REST = "botocore chain (web identity, container, instance metadata)"

#: Every option the S3 service accepts.
OPTIONS = S3_CREDENTIAL_OPTIONS | frozenset({"s3_checksum", "ca_bundle", "insecure", "proxy",
                                             "client_cert", "client_key"})


def _padded(key_id: Sourced[str] | None, secret: Sourced[str] | None) -> str:
    """Said after a key pair's source when a key has whitespace around it (a pasted key):
    S3 refused it with a bare 403. Which one, never its value."""
    padded = [name for name, key in (("access key id", key_id), ("secret key", secret))
              if key is not None and isinstance(key.value, str) and key.value != key.value.strip()]
    if not padded:
        return ""
    return (f" (its {' and its '.join(padded)} {'have' if len(padded) > 1 else 'has'} "
            "whitespace around it: a space copied with it?)")


def _without_token(key_id: Sourced[str] | None, token: Sourced[str] | None) -> str:
    """Said after a key pair's source when its key id is a temporary one (AWS STS's
    ``ASIA`` prefix) and no session token goes with it: S3 refused it as a key id that
    "does not exist" (vLLM's S3_ variables take no token; AWS_SESSION_TOKEN belongs to
    the AWS_ pair)."""
    if key_id is None or token is not None or not str(key_id.value).startswith("ASIA"):
        return ""
    return (" (its key id is a temporary one, ASIA..., sent without a session token: give the "
            "token with the pair of its own source: s3_session_token with the s3_ options, "
            "AWS_SESSION_TOKEN with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, access_token in "
            "~/.s3cfg; vLLM's S3_ variables take none)")


@dataclasses.dataclass(frozen=True, repr=False)
class S3Credentials:
    """Resolved S3 settings. ``access_key_id is None`` (and not anonymous)
    means botocore's chain (level 5) supplies the keys."""

    access_key_id: Sourced[str] | None = None
    secret_access_key: Sourced[str] | None = None
    session_token: Sourced[str] | None = None
    endpoint: Sourced[str] | None = None
    region: Sourced[str] | None = None
    addressing_style: Sourced[str] | None = None
    profile: Sourced[str] | None = None
    anonymous: bool = False
    #: Whether the endpoints of the AWS variables and the config file are ignored
    #: (``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``), and who said so; ``None``: nobody did.
    ignore_configured_endpoints: Sourced[bool] | None = None
    #: Every place searched for a key pair, in order (for error messages).
    looked_in: tuple[str, ...] = ()

    @property
    def uses_botocore_chain(self) -> bool:
        return self.access_key_id is None and not self.anonymous

    @property
    def key_source(self) -> str:
        """Where the key pair came from, e.g. ``'env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY'``."""
        if self.anonymous:
            return "anonymous (unsigned requests)"
        if self.access_key_id is None:
            return self.chain_description
        return (self.access_key_id.source + _padded(self.access_key_id, self.secret_access_key)
                + _without_token(self.access_key_id, self.session_token))

    @property
    def chain_description(self) -> str:
        """Where level 5 looks: the ~/.aws files for the chosen profile, then the rest."""
        profile = self.profile.value if self.profile else "default"
        return f"~/.aws profile {profile!r} / {CHAIN_REST}"

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name != "looked_in" and getattr(self, f.name) not in (None, False)
        )
        return f"S3Credentials({fields})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("refusing to pickle S3 credentials")


def _pair(
    key: str | None, secret: str | None, key_src: str, secret_src: str
) -> tuple[Sourced[str], Sourced[str]] | None:
    """Both halves of a pair from one source, nothing, or an error naming both."""
    if key is None and secret is None:
        return None
    if key is None or secret is None:
        have, missing = (key_src, secret_src) if key is not None else (secret_src, key_src)
        raise ConfigurationError(
            f"{have} is set but {missing} is not; an S3 key pair must come whole from one "
            "source (set both, or neither)"
        )
    source = _pair_source(key_src, secret_src)
    return Sourced(key, source, secret=True), Sourced(secret, source, secret=True)


def _pair_source(key_src: str, secret_src: str) -> str:
    kind, _, key_name = key_src.partition(" ")
    secret_name = secret_src.partition(" ")[2]
    if kind == secret_src.partition(" ")[0] and kind in ("option", "env"):
        return f"{kind} {key_name}/{secret_name}"
    return key_src


def resolve_s3_credentials(
    options: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> S3Credentials:
    """Resolve levels 1-4 of the precedence order (see the module docstring).

    Raises :class:`ConfigurationError` for a half-set key pair, a bad
    addressing style, or an explicit ``s3_config_path`` that cannot be read.
    """
    env = os.environ if env is None else env
    looked: list[str] = []
    pair: tuple[Sourced[str], Sourced[str]] | None = None
    token: Sourced[str] | None = None
    profile: Sourced[str] | None = None
    anonymous = bool(options.get("anonymous"))

    # 1. explicit options
    looked.append("options s3_access_key_id/s3_secret_access_key")
    pair = _pair(option_text(options, "s3_access_key_id"), option_text(options, "s3_secret_access_key"),
                 "option s3_access_key_id", "option s3_secret_access_key")
    if (t := option_text(options, "s3_session_token")) is not None:
        if pair is None:
            raise ConfigurationError(
                "option s3_session_token is set but s3_access_key_id/s3_secret_access_key "
                "are not; a session token belongs to the key pair it was issued with"
            )
        token = Sourced(t, "option s3_session_token", secret=True)
    if (p := option_text(options, "s3_profile")) is not None:
        profile = Sourced(p, "option s3_profile")
    if anonymous and (pair is not None or profile is not None):
        # The credentials given were dropped without a word and requests went unsigned
        # (a private bucket then answered 403). Variables stay overridable by anonymous=True.
        given = "s3_access_key_id/s3_secret_access_key" if pair is not None else "s3_profile"
        raise ConfigurationError(
            f"options anonymous=True (unsigned requests) and {given} (signed ones) "
            "contradict each other; give one")

    # 2. vLLM / tensorizer variables, 3. standard AWS variables
    if pair is None and profile is None:
        looked.append("env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY")
        pair = _pair(env_text(env, "S3_ACCESS_KEY_ID"), env_text(env, "S3_SECRET_ACCESS_KEY"),
                     "env S3_ACCESS_KEY_ID", "env S3_SECRET_ACCESS_KEY")
    if pair is None and profile is None:
        looked.append("env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
        pair = _pair(env_text(env, "AWS_ACCESS_KEY_ID"), env_text(env, "AWS_SECRET_ACCESS_KEY"),
                     "env AWS_ACCESS_KEY_ID", "env AWS_SECRET_ACCESS_KEY")
        if pair is not None and (t := env_text(env, "AWS_SESSION_TOKEN")) is not None:
            token = Sourced(t, "env AWS_SESSION_TOKEN", secret=True)
        for name in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE"):  # both, in botocore's order
            if pair is None and profile is None and (p := env_text(env, name)) is not None:
                profile = Sourced(p, f"env {name}")

    # 4. s3cmd config (keys only when nothing above chose keys or a profile;
    #    its endpoint still applies below the variables)
    cfg_path = option_text(options, "s3_config_path")
    explicit_cfg = cfg_path is not None
    cfg_path = os.path.expanduser(cfg_path or "~/.s3cfg")
    cfg: dict[str, str] = {}
    # A named profile is the user's AWS setup: the implicit ~/.s3cfg (another tool's, often
    # another store's) gave its endpoint to that profile's keys.
    if explicit_cfg or (profile is None and os.path.isfile(cfg_path)):
        cfg = read_s3cfg(cfg_path)
    if pair is None and profile is None:
        looked.append(f"s3cmd config {cfg_path}" + ("" if cfg else " (absent)"))
        src = f"s3cmd config {cfg_path}"
        pair = _pair(cfg.get("access_key"), cfg.get("secret_key"),
                     f"{src} access_key", f"{src} secret_key")
        if pair is not None:
            pair = (Sourced(pair[0].value, src, True), Sourced(pair[1].value, src, True))
            if (t := cfg.get("access_token")) is not None:
                token = Sourced(t, f"{src} access_token", secret=True)

    # 5. left to botocore (profiles, then its remaining chain)
    if pair is None and not anonymous:
        name = profile.value if profile else "default"
        looked.append(f"{aws_file(env, 'credentials')} [profile {name}]")
        looked.append(f"{aws_file(env, 'config')} [profile {name}]")
        looked.append(CHAIN_REST)

    for part in (*(pair or ()), token):
        if part is not None and any(ord(c) < 0x20 or c == "\x7f" for c in str(part.value)):
            # botocore would send it in the Authorization header and its error
            # ("Invalid header value ...") would print the key id and signature
            raise ConfigurationError(f"{part.source} contains a control character (a newline?); "
                                     "the value is not shown")
    for part in (pair[0] if pair else None, token):
        # The key id (in Authorization) and the token (X-Amz-Security-Token) are sent as
        # headers: http.client's UnicodeEncodeError would hold the whole header value.
        if part is not None and not str(part.value).isascii():
            raise ConfigurationError(f"{part.source} contains a character that is not ASCII "
                                     "(AWS key ids and tokens are ASCII); the value is not shown")
    aws_config = read_profile_config(profile, env)
    ignore = ignore_configured_endpoints(env, aws_config)
    # The file's endpoint travels with the file's keys (as s3cmd and tensorizer pair them):
    # keys from anywhere else were sent to another tool's store. A file named by
    # s3_config_path that holds no keys is the user's choice of endpoint for any keys.
    cfg_keys = pair is not None and pair[0].source.startswith("s3cmd config")
    cfg_has_pair = "access_key" in cfg or "secret_key" in cfg
    cfg_endpoint = "keys" if cfg_keys else "any" if explicit_cfg and not cfg_has_pair else None
    endpoint = resolve_endpoint(options, env, cfg if cfg_endpoint else {}, cfg_path, aws_config,
                                 ignore is not None and ignore.value, cfg_endpoint == "keys")
    if endpoint is not None:
        check_endpoint(endpoint)
    region = resolve_region(options, env)
    style = resolve_style(options, cfg, cfg_path, endpoint, aws_config)
    return S3Credentials(
        access_key_id=None if anonymous or pair is None else pair[0],
        secret_access_key=None if anonymous or pair is None else pair[1],
        session_token=None if anonymous else token,
        endpoint=endpoint,
        region=region,
        addressing_style=style,
        profile=profile,
        anonymous=anonymous,
        ignore_configured_endpoints=ignore,
        looked_in=tuple(looked),
    )


def half_pair_in_aws_files(profile: str | None,
                           env: Mapping[str, str] | None = None) -> ConfigurationError | None:
    """The error for a profile of the ~/.aws files that sets ``aws_secret_access_key``
    without ``aws_access_key_id``, or for one of those files that exists but cannot be
    read (botocore skips both without a word and goes on to instance metadata), else
    ``None``. The files are named, never quoted."""
    from botocore.configloader import load_config, raw_config_parse

    env = os.environ if env is None else env
    name = profile or "default"
    for which in ("credentials", "config"):
        path = aws_file(env, which)
        if (why := unreadable(path)) is not None:
            # botocore skips a file it cannot read (configparser ignores the OSError)
            return ConfigurationError(
                f"cannot read the AWS {which} file {path} ({why}), where profile {name!r} "
                "would be found")
        try:
            if which == "credentials":
                section = raw_config_parse(path).get(name) or {}
            else:
                section = load_config(path).get("profiles", {}).get(name) or {}
        except Exception:  # absent or unparsable: botocore reported (or skipped) it already
            continue
        if section.get("aws_secret_access_key") and not section.get("aws_access_key_id"):
            return ConfigurationError(
                f"{path} [profile {name}] sets aws_secret_access_key but not "
                "aws_access_key_id; an S3 key pair must come whole from one source "
                "(set both, or neither)")
    return None


def no_credentials_error(creds: S3Credentials) -> TensorstreamError:
    """What to raise when botocore's chain found no keys: a half pair in the ~/.aws
    files it skipped, else :class:`MissingCredentialsError` naming every place."""
    from ...errors import MissingCredentialsError

    half = half_pair_in_aws_files(creds.profile.value if creds.profile else None)
    if half is not None:
        return half
    return MissingCredentialsError("no S3 credentials found", looked_in=list(creds.looked_in),
                                   advice=NO_CREDENTIALS_ADVICE)


def _no_endpoint_source(creds: S3Credentials) -> str:
    ignore = creds.ignore_configured_endpoints
    if ignore is not None and ignore.value:
        return f"AWS (configured endpoint URLs ignored: {ignore.source})"
    return "AWS (no endpoint configured)"


def process_timeout(options: Mapping[str, Any]) -> float:
    """The option ``s3_credential_process_timeout`` (validated before), else the default."""
    value = options.get("s3_credential_process_timeout")
    return DEFAULT_CREDENTIAL_PROCESS_TIMEOUT if value is None else float(value)


def masked_key_id(value: str) -> str:
    """An access key id shown like the AWS CLI does: only its last 4 characters."""
    return "***" + value[-4:] if len(value) >= 16 else mask(value)


def describe_credentials(parsed: ParsedURI, options: dict[str, Any]) -> CredentialReport:
    """Report for ``s3://``: the precedence order of :mod:`tensorstream.providers.s3.config`."""
    from ...credentials.report import CredentialReport, ReportLine, report_line, tls_notes
    from .chain import botocore_region, resolve_botocore_chain

    creds = resolve_s3_credentials(options)
    notes: list[str] = []
    key, secret, token = creds.access_key_id, creds.secret_access_key, creds.session_token
    looked: tuple[str, ...] = ()
    if creds.anonymous:
        notes.append("anonymous=True: requests are unsigned")
    elif creds.uses_botocore_chain:
        found = resolve_botocore_chain(creds, process_timeout(options))
        if found is None and (half := half_pair_in_aws_files(
                creds.profile.value if creds.profile else None)) is not None:
            raise half
        if found is None:
            looked = creds.looked_in
            notes.append("no S3 credentials found; set anonymous=True for public buckets")
        else:
            key, secret, token = found
    region = creds.region or botocore_region(creds)
    lines = [
        report_line("access_key_id", key, shown=masked_key_id(str(key.value)) if key else None),
        report_line("secret_access_key", secret),
        report_line("session_token", token),
        report_line("endpoint", creds.endpoint, shown=redact(creds.endpoint.value))
        if creds.endpoint
        else ReportLine("endpoint", "<AWS default>", _no_endpoint_source(creds)),
        report_line("region", region)
        if region
        else ReportLine("region", "<unset>", "botocore default (us-east-1)"),
        report_line("addressing_style", creds.addressing_style),
        report_line("profile", creds.profile),
    ]
    notes.extend(tls_notes(options))
    return CredentialReport(parsed.redacted(), tuple(lines), looked_in=looked, notes=tuple(notes))
