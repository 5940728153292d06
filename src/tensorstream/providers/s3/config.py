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
:func:`resolve_botocore_chain` (synchronously, for ``describe_credentials``).

A key pair is taken whole from one source; half of a pair is an error that
names both halves. A session token belongs to the pair of its own source.
``~/.s3cfg``'s endpoint travels only with its keys, and they with it (below
``s3_endpoint`` and ``S3_ENDPOINT_URL``): keys from elsewhere were sent to
another tool's store.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...credentials.base import Sourced, mask
from ...errors import ConfigurationError, TensorstreamError
from ...uri import ParsedURI, redact
from .process import DEFAULT_CREDENTIAL_PROCESS_TIMEOUT, bound_credential_process
from .profile import (
    ADDRESSING_STYLES,
    ProfileConfig,
    config_profile_name,
    ignore_configured_endpoints,
    profile_setting_file,
    read_profile_config,
)

if TYPE_CHECKING:
    from ...credentials.report import CredentialReport

__all__ = [
    "OPTIONS",
    "describe_credentials",
    "S3_CREDENTIAL_OPTIONS",
    "S3Credentials",
    "normalize_endpoint",
    "aws_files",
    "half_pair_in_aws_files",
    "no_credentials_error",
    "resolve_botocore_chain",
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
        return self.access_key_id.source

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


def normalize_endpoint(url: str) -> str:
    """Add ``https://`` to a scheme-less endpoint; strip a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "https://" + url
    return url.rstrip("/")


def _check_endpoint(endpoint: Sourced[str]) -> None:
    """An endpoint botocore can use, or a ConfigurationError naming where it came from
    (botocore said 'Invalid IPv6 URL' or 'Port out of range', or, for one with no host,
    failed inside the credential chain)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint.value)
        _ = parts.port  # ValueError when out of range or not a number
        problem = ("the scheme is not http or https" if parts.scheme not in ("http", "https")
                   else "it has no host" if not parts.hostname
                   # botocore: "Custom endpoint `<it, whole>` was not a valid URI"
                   else "it has a query ('?'): it is scheme://host[:port][/path]"
                   if parts.query or endpoint.value.endswith("?") else None)
        if problem is None:
            # botocore's own test: a host name it refuses (a space, an underscore) failed
            # inside the credential chain, reported as a credentials problem.
            from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

            if not (is_valid_endpoint_url(endpoint.value)
                    or is_valid_ipv6_endpoint_url(endpoint.value)):
                problem = f"botocore refuses the host name {parts.hostname!r}"
    except ValueError as exc:
        problem = str(exc)
    if problem is not None:
        shown = redact(endpoint.value)
        if "?" in shown:  # a query is never shown: its secret need not have a known name
            shown = shown.split("?", 1)[0] + "?..."
        raise ConfigurationError(f"{endpoint.source} {shown!r} is not an S3 "
                                 f"endpoint URL: {problem}")


def _opt(options: Mapping[str, Any], name: str) -> str | None:
    value = options.get(name)
    return None if value is None or value == "" else str(value)


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value or None


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


#: An s3cmd config is a few hundred bytes; more is not one.
_S3CFG_LIMIT = 1 << 20


def _read_s3cfg(path: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    from ..local.provider import open_regular

    try:  # through open_regular: a FIFO here would block forever
        with open(open_regular(path), encoding="utf-8", errors="replace") as f:
            text = f.read(_S3CFG_LIMIT)
    except (OSError, TensorstreamError) as exc:
        reason = getattr(exc, "strerror", None) or "not a regular file"
        raise ConfigurationError(f"cannot read s3cmd config {path}: {reason}") from None
    if not text.lstrip().startswith("["):
        text = "[default]\n" + text
    try:
        parser.read_string(text, source=path)
    except configparser.Error as exc:
        raise ConfigurationError(f"cannot parse s3cmd config {path}: {type(exc).__name__}") from exc
    sections = parser.sections()
    if not sections:
        return {}
    section = "default" if "default" in sections else sections[0]
    return {k: v.strip() for k, v in parser.items(section) if v.strip()}


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


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
    pair = _pair(_opt(options, "s3_access_key_id"), _opt(options, "s3_secret_access_key"),
                 "option s3_access_key_id", "option s3_secret_access_key")
    if (t := _opt(options, "s3_session_token")) is not None:
        if pair is None:
            raise ConfigurationError(
                "option s3_session_token is set but s3_access_key_id/s3_secret_access_key "
                "are not; a session token belongs to the key pair it was issued with"
            )
        token = Sourced(t, "option s3_session_token", secret=True)
    if (p := _opt(options, "s3_profile")) is not None:
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
        pair = _pair(_env(env, "S3_ACCESS_KEY_ID"), _env(env, "S3_SECRET_ACCESS_KEY"),
                     "env S3_ACCESS_KEY_ID", "env S3_SECRET_ACCESS_KEY")
    if pair is None and profile is None:
        looked.append("env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
        pair = _pair(_env(env, "AWS_ACCESS_KEY_ID"), _env(env, "AWS_SECRET_ACCESS_KEY"),
                     "env AWS_ACCESS_KEY_ID", "env AWS_SECRET_ACCESS_KEY")
        if pair is not None and (t := _env(env, "AWS_SESSION_TOKEN")) is not None:
            token = Sourced(t, "env AWS_SESSION_TOKEN", secret=True)
        for name in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE"):  # both, in botocore's order
            if pair is None and profile is None and (p := _env(env, name)) is not None:
                profile = Sourced(p, f"env {name}")

    # 4. s3cmd config (keys only when nothing above chose keys or a profile;
    #    its endpoint still applies below the variables)
    cfg_path = _opt(options, "s3_config_path")
    explicit_cfg = cfg_path is not None
    cfg_path = os.path.expanduser(cfg_path or "~/.s3cfg")
    cfg: dict[str, str] = {}
    # A named profile is the user's AWS setup: the implicit ~/.s3cfg (another tool's, often
    # another store's) gave its endpoint to that profile's keys.
    if explicit_cfg or (profile is None and os.path.isfile(cfg_path)):
        cfg = _read_s3cfg(cfg_path)
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
        looked.append(f"{_aws_file(env, 'credentials')} [profile {name}]")
        looked.append(f"{_aws_file(env, 'config')} [profile {name}]")
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
    endpoint = _resolve_endpoint(options, env, cfg if cfg_endpoint else {}, cfg_path, aws_config,
                                 ignore is not None and ignore.value, cfg_endpoint == "keys")
    if endpoint is not None:
        _check_endpoint(endpoint)
    region = _resolve_region(options, env)
    style = _resolve_style(options, cfg, cfg_path, endpoint, aws_config)
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


def _aws_file(env: Mapping[str, str], which: str) -> str:
    var = "AWS_SHARED_CREDENTIALS_FILE" if which == "credentials" else "AWS_CONFIG_FILE"
    return env.get(var) or f"~/.aws/{which}"


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
        path = _aws_file(env, which)
        full = os.path.expanduser(os.path.expandvars(path))
        if os.path.lexists(full) and not (os.path.isfile(full) and os.access(full, os.R_OK)):
            # botocore skips a file it cannot read (configparser ignores the OSError)
            why = ("not a regular file" if os.path.exists(full) and not os.path.isfile(full)
                   else "permission denied" if os.path.exists(full) else "a dangling link")
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
    return MissingCredentialsError("no S3 credentials found", looked_in=list(creds.looked_in))


def aws_files(env: Mapping[str, str]) -> str:
    """The AWS config and credentials files botocore reads, for messages."""
    return f"{_aws_file(env, 'config')}, {_aws_file(env, 'credentials')}"


def _resolve_endpoint(
    options: Mapping[str, Any], env: Mapping[str, str], cfg: dict[str, str], cfg_path: str,
    aws_config: ProfileConfig, ignore_configured: bool, cfg_keys: bool = False,
) -> Sourced[str] | None:
    """The endpoint by the order of docs/s3.md. ``cfg`` is the s3cmd file when its
    endpoint may be used (else empty); ``cfg_keys``: the keys are its own, and its
    ``host_base`` then beats the AWS SDK's variables (s3cmd's and tensorizer's pairing).
    ``ignore_configured`` drops the AWS SDK's own settings (its variables, the config
    file), as botocore does; the option, vLLM's ``S3_ENDPOINT_URL`` and s3cmd's
    ``host_base`` are not the SDK's and still apply."""
    if (v := _opt(options, "s3_endpoint")) is not None:
        return Sourced(normalize_endpoint(v), "option s3_endpoint")
    if (v := _env(env, "S3_ENDPOINT_URL")) is not None:
        return Sourced(normalize_endpoint(v), "env S3_ENDPOINT_URL")
    if cfg_keys and (found := _cfg_endpoint(cfg, cfg_path)) is not None:
        return found
    names = () if ignore_configured else ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    for name in names:  # botocore's order
        if (v := _env(env, name)) is not None:
            return Sourced(normalize_endpoint(v), f"env {name}")
    if (found := _cfg_endpoint(cfg, cfg_path)) is not None:
        return found
    if not ignore_configured and (found := aws_config.endpoint()) is not None:
        # Resolved here, not left to botocore, so that messages name it and the
        # defaults of a custom endpoint apply (path style, as boto3 takes for one).
        return Sourced(normalize_endpoint(found.value), found.source)
    return None  # AWS


def _cfg_endpoint(cfg: dict[str, str], cfg_path: str) -> Sourced[str] | None:
    if (host := cfg.get("host_base")) is None:
        return None
    if "://" not in host:
        https = _truthy(cfg.get("use_https", "true"))
        host = f"{'https' if https else 'http'}://{host}"
    return Sourced(normalize_endpoint(host), f"s3cmd config {cfg_path} host_base")


#: A region name is a host label (botocore's rule, checked when it builds a client).
_REGION = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)")


def _resolve_region(options: Mapping[str, Any], env: Mapping[str, str]) -> Sourced[str] | None:
    found: Sourced[str] | None = None
    if (v := _opt(options, "s3_region")) is not None:
        found = Sourced(v, "option s3_region")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if found is None and (v := _env(env, name)) is not None:
            found = Sourced(v, f"env {name}")
    if found is not None and not _REGION.fullmatch(found.value):
        # botocore's InvalidRegionError was "S3 sent a malformed answer", and reads that
        # built no botocore client signed for it
        raise ConfigurationError(f"{found.source} {found.value!r} is not a region name "
                                 "(letters, digits and '-', e.g. us-east-1)")
    return found  # else botocore: region in ~/.aws/config, else us-east-1


def _resolve_style(
    options: Mapping[str, Any], cfg: dict[str, str], cfg_path: str, endpoint: Sourced[str] | None,
    aws_config: ProfileConfig,
) -> Sourced[str]:
    if (v := _opt(options, "s3_addressing_style")) is not None:
        if v not in ADDRESSING_STYLES:
            raise ConfigurationError(
                f"s3_addressing_style must be one of {', '.join(ADDRESSING_STYLES)}, got {v!r}"
            )
        return Sourced(v, "option s3_addressing_style")
    if endpoint is not None and endpoint.source.startswith("s3cmd"):
        # s3cmd's own file says how to address its endpoint, not the AWS profile's
        if "%(bucket)s" in cfg.get("host_bucket", ""):
            return Sourced("virtual", f"s3cmd config {cfg_path} host_bucket")
        if cfg.get("host_bucket"):
            return Sourced("path", f"s3cmd config {cfg_path} host_bucket")
    elif (style := aws_config.addressing_style()) is not None:
        # boto3 honours it; passing our default to botocore's client overrode it
        return style
    if endpoint is not None:
        # S3-compatible servers (MinIO, Ceph, moto, ...) all accept path style.
        return Sourced("path", "default for a custom endpoint")
    return Sourced("auto", "default")


def chain_source(method: str | None, profile: str | None, env: Mapping[str, str] | None = None) -> str:
    """Describe botocore's credential ``method`` as a source, naming the file."""
    env = os.environ if env is None else env
    name = profile or "default"
    if method == "shared-credentials-file":
        return f"{_aws_file(env, 'credentials')} [profile {name}]"
    if method == "config-file":
        return f"{_aws_file(env, 'config')} [profile {name}]"
    if method == "assume-role-with-web-identity" and env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return "env AWS_ROLE_ARN/AWS_WEB_IDENTITY_TOKEN_FILE (botocore assume-role-with-web-identity)"
    if method == "sso":
        return f"{_aws_file(env, 'config')} [profile {name}] (botocore sso)"
    if (setting := _PROFILE_METHODS.get(method or "")) is not None:
        # "botocore custom-process" named neither the profile nor the file of a rejected key
        return f"{profile_setting_file(name, setting, env)} [profile {name}] {setting} " \
               f"(botocore {method})"
    return f"botocore {method or 'credential chain'}"


#: botocore's credential providers driven by one setting of a profile, and that setting.
_PROFILE_METHODS = {"custom-process": "credential_process", "assume-role": "role_arn",
                    "assume-role-with-web-identity": "web_identity_token_file"}


def resolve_botocore_chain(
    creds: S3Credentials, process_timeout: float = DEFAULT_CREDENTIAL_PROCESS_TIMEOUT,
) -> tuple[Sourced[str], Sourced[str], Sourced[str] | None] | None:
    """Run botocore's chain synchronously (level 5). ``None`` if it finds nothing.

    May contact instance metadata unless ``AWS_EC2_METADATA_DISABLED=true``; a
    ``credential_process`` is stopped after ``process_timeout`` seconds.
    """
    import botocore.exceptions
    import botocore.session

    profile = creds.profile.value if creds.profile else None
    session = botocore.session.Session(profile=profile)
    try:
        bound_credential_process(session, process_timeout)
        found = session.get_credentials()
    except Exception as exc:
        from .errors import map_session_error  # botocore's exceptions: only on this path

        mapped = map_session_error(exc, profile, aws_files(os.environ),
                                   creds.profile.source if creds.profile else "")
        if mapped is exc:
            raise
        raise mapped from exc
    if found is None:
        return None
    frozen = found.get_frozen_credentials()
    source = chain_source(getattr(found, "method", None), profile)
    token = Sourced(frozen.token, source, secret=True) if frozen.token else None
    return (Sourced(frozen.access_key, source, secret=True),
            Sourced(frozen.secret_key, source, secret=True), token)


def botocore_region(creds: S3Credentials) -> Sourced[str] | None:
    """The region botocore would take from the profile's config, if any."""
    import botocore.session

    profile = creds.profile.value if creds.profile else None
    try:
        region = botocore.session.Session(profile=profile).get_config_variable("region")
    except Exception:
        return None
    if not region:
        return None
    # botocore reads AWS_PROFILE's section even where the keys came from variables
    name = config_profile_name(profile, os.environ)
    return Sourced(str(region), f"{_aws_file(os.environ, 'config')} [profile {name}] region")


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
