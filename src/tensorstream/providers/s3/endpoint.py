"""Where an S3 store is and how it is addressed: the endpoint, region and addressing
style by the order of docs/s3.md (options, vLLM's and the AWS SDK's variables, s3cmd's
``~/.s3cfg``, the AWS config file), each with the source that supplied it."""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from typing import Any

from ...credentials.base import Sourced
from ...errors import ConfigurationError, TensorstreamError
from ...uri import redact
from .profile import ADDRESSING_STYLES, ProfileConfig

__all__ = ["check_endpoint", "env_text", "no_scheme", "normalize_endpoint", "option_text",
           "read_s3cfg", "resolve_endpoint", "resolve_region", "resolve_style", "truthy"]

#: An s3cmd config is a few hundred bytes; more is not one.
_S3CFG_LIMIT = 1 << 20


def option_text(options: Mapping[str, Any], name: str) -> str | None:
    value = options.get(name)
    return None if value is None or value == "" else str(value)


def env_text(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value or None


def normalize_endpoint(url: str) -> str:
    """Add ``https://`` to a scheme-less endpoint (tensorizer's ``s3_endpoint`` and
    ``S3_ENDPOINT_URL``: the AWS SDK's settings refuse one, :func:`no_scheme`); strip a
    trailing slash; the scheme in lower case (``HTTPS://`` is ``https://``: compared as
    written, it was no TLS endpoint to the reads' choice of a trust store)."""
    url = url.strip()
    if "://" not in url:
        url = "https://" + url
    scheme, _, rest = url.partition("://")
    return f"{scheme.lower()}://{rest}".rstrip("/")


def no_scheme(where: str, url: str) -> ConfigurationError | None:
    """The error for an endpoint written without a scheme (``minio:9000``), naming
    ``where`` it was given; None where it has one. boto3 and the aws CLI refuse such an
    endpoint in their settings (``--endpoint-url``, ``AWS_ENDPOINT_URL[_S3]``, the config
    file's ``endpoint_url``: ``Invalid endpoint``); taking it as https:// sent a
    plain-text server (MinIO on a port) into a TLS handshake. (tensorizer's own
    spellings, ``s3_endpoint`` and ``S3_ENDPOINT_URL``, mean https:// without one.)"""
    if "://" in url:
        return None
    if not url.strip():  # (the advice would name no host)
        return ConfigurationError(f"{where} is blank; unset it, or write it as "
                                  "http://host:port (plain text) or https://host:port (TLS)")
    host = url.strip().rpartition("@")[2].split("?", 1)[0].split("/", 1)[0]
    if host.count(":") > 1 and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal (http://::1 is no URL botocore takes)
    shown = _shown(url.strip())
    return ConfigurationError(f"{where} {shown!r} has no scheme; write it as http://{host} "
                              f"(plain text) or https://{host} (TLS)")


def _shown(url: str) -> str:
    """``url`` as an error may show it: no user info, no query (either may hold a secret)."""
    shown = redact(url)
    if "://" not in shown and "@" in shown:  # (redact looks for user info after a scheme)
        shown = "***@" + shown.rpartition("@")[2]
    if "?" in shown:  # a query is never shown: its secret need not have a known name
        shown = shown.split("?", 1)[0] + "?..."
    return shown


def _given(url: str, where: str) -> Sourced[str]:
    """An endpoint of the AWS SDK's settings, given with a scheme (as botocore requires),
    as :func:`normalize_endpoint` writes it."""
    if (error := no_scheme(where, url)) is not None:
        raise error
    return Sourced(normalize_endpoint(url), where)


def check_endpoint(endpoint: Sourced[str]) -> None:
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
        shown = _shown(endpoint.value)
        raise ConfigurationError(f"{endpoint.source} {shown!r} is not an S3 "
                                 f"endpoint URL: {problem}")


def read_s3cfg(path: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    from ..local.provider import open_regular

    try:  # through open_regular: a FIFO here would block forever
        with open(open_regular(path), encoding="utf-8", errors="replace") as f:
            text = f.read(_S3CFG_LIMIT)
    except (OSError, TensorstreamError) as exc:
        # open_regular maps the OSError (chained): a missing or unreadable file was
        # "not a regular file"
        cause = exc.__cause__ if isinstance(exc, TensorstreamError) else exc
        reason = getattr(cause, "strerror", None) or (
            "a directory" if os.path.isdir(path) else "not a regular file")
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


def truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def resolve_endpoint(
    options: Mapping[str, Any], env: Mapping[str, str], cfg: dict[str, str], cfg_path: str,
    aws_config: ProfileConfig, ignore_configured: bool, cfg_keys: bool = False,
) -> Sourced[str] | None:
    """The endpoint by the order of docs/s3.md. ``cfg`` is the s3cmd file when its
    endpoint may be used (else empty); ``cfg_keys``: the keys are its own, and its
    ``host_base`` then beats the AWS SDK's variables (s3cmd's and tensorizer's pairing).
    ``ignore_configured`` drops the AWS SDK's own settings (its variables, the config
    file), as botocore does; the option, vLLM's ``S3_ENDPOINT_URL`` and s3cmd's
    ``host_base`` are not the SDK's and still apply."""
    if (v := option_text(options, "s3_endpoint")) is not None:
        return Sourced(normalize_endpoint(v), "option s3_endpoint")
    if (v := env_text(env, "S3_ENDPOINT_URL")) is not None:
        return Sourced(normalize_endpoint(v), "env S3_ENDPOINT_URL")
    if cfg_keys and (found := _cfg_endpoint(cfg, cfg_path)) is not None:
        return found
    names = () if ignore_configured else ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    for name in names:  # botocore's order
        if (v := env_text(env, name)) is not None:
            return _given(v, f"env {name}")
    if (found := _cfg_endpoint(cfg, cfg_path)) is not None:
        return found
    if not ignore_configured and (found := aws_config.endpoint()) is not None:
        # Resolved here, not left to botocore, so that messages name it and the
        # defaults of a custom endpoint apply (path style, as boto3 takes for one).
        return _given(found.value, found.source)
    return None  # AWS


def _cfg_endpoint(cfg: dict[str, str], cfg_path: str) -> Sourced[str] | None:
    if (host := cfg.get("host_base")) is None:
        return None
    if "://" not in host:
        https = truthy(cfg.get("use_https", "true"))
        host = f"{'https' if https else 'http'}://{host}"
    return Sourced(normalize_endpoint(host), f"s3cmd config {cfg_path} host_base")


#: A region name is a host label (botocore's rule, checked when it builds a client).
_REGION = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)")


def resolve_region(options: Mapping[str, Any], env: Mapping[str, str]) -> Sourced[str] | None:
    found: Sourced[str] | None = None
    if (v := option_text(options, "s3_region")) is not None:
        found = Sourced(v, "option s3_region")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if found is None and (v := env_text(env, name)) is not None:
            found = Sourced(v, f"env {name}")
    if found is not None and not _REGION.fullmatch(found.value):
        # botocore's InvalidRegionError was "S3 sent a malformed answer", and reads that
        # built no botocore client signed for it
        raise ConfigurationError(f"{found.source} {found.value!r} is not a region name "
                                 "(letters, digits and '-', e.g. us-east-1)")
    return found  # else botocore: region in ~/.aws/config, else us-east-1


def resolve_style(
    options: Mapping[str, Any], cfg: dict[str, str], cfg_path: str, endpoint: Sourced[str] | None,
    aws_config: ProfileConfig,
) -> Sourced[str]:
    if (v := option_text(options, "s3_addressing_style")) is not None:
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
