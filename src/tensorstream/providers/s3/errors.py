"""The S3 provider's one error-mapping function: botocore/aiohttp -> tensorstream.errors.

S3's own error answers (a ``ClientError``'s code and status, a raw answer's XML
body) go through the table of :mod:`.error_codes`, re-exported here with
:class:`ErrorContext`; errors of setting up a session and of botocore's
credential chain are mapped by :func:`map_session_error`.

aiohttp errors only come from aiobotocore (list, delete, writes); it is not
imported here, so a read-only process never loads it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sys
from typing import Any

import botocore.exceptions as bce

from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    IncompleteReadError,
    MissingCredentialsError,
    ProtocolError,
    StorageTimeoutError,
    TensorstreamError,
)
from ...uri import redact, redact_text
from .._http.proxies import refusal_hint, tunnel_refusal
from .._http.status_errors import plain_text_answer
from .error_codes import ErrorContext, WrongRegionError, map_client_error, map_s3_http_error
from .profile import (
    NO_CREDENTIALS_ADVICE,
    chain_source,
    config_profile_name,
    profile_setting_file,
)

__all__ = ["ErrorContext", "WrongRegionError", "from_credential_chain", "map_s3_error", "map_s3_http_error",
           "map_session_error"]


def map_s3_error(exc: BaseException, ctx: ErrorContext, *, received: int = 0) -> BaseException:
    """The tensorstream error for ``exc`` (returned, not raised).

    ``received`` is how many bytes of a body were already delivered, so a
    broken body resumes instead of restarting. Unknown exceptions are
    returned unchanged.
    """
    if isinstance(exc, TensorstreamError):
        return exc
    ctx.withhold_in(exc)
    aio = _aiohttp_errors()
    if ctx.proxy is not None and (proxied := _proxy_error(exc, ctx)) is not None:
        return proxied
    if isinstance(exc, bce.ClientError):
        return map_client_error(exc, ctx)
    if isinstance(exc, bce.PartialCredentialsError):
        return ConfigurationError(
            f"half of an S3 key pair in {exc.kwargs.get('provider')}: "
            f"{exc.kwargs.get('cred_var')} is missing; set both, or neither"
        )
    if isinstance(exc, bce.NoCredentialsError):
        return MissingCredentialsError("no S3 credentials found", advice=NO_CREDENTIALS_ADVICE)
    if isinstance(exc, bce.ProfileNotFound):
        return ConfigurationError(f"AWS profile not found: {exc.kwargs.get('profile')!r}")
    if isinstance(exc, (bce.SSLError, *aio.ssl)) and plain_text_answer(exc):
        err = ConnectionFailedError(
            f"{redact(ctx.endpoint)} answered in plain text, not TLS: use an http:// endpoint "
            "(s3_endpoint) instead of https://")
        err.temporary = False
        return err
    if isinstance(exc, (bce.SSLError, *aio.ssl)):
        err = ConnectionFailedError(
            f"TLS handshake with {redact(ctx.endpoint)} failed (untrusted or mismatched "
            "certificate?); pass ca_bundle=<PEM path>, or insecure=True to skip verification"
        )
        err.temporary = False  # retrying cannot fix a certificate
        return err
    if isinstance(exc, bce.ConnectTimeoutError):
        where = _address(exc)
        return StorageTimeoutError(
            f"connect timeout to {where[0] if where else redact(ctx.endpoint)}",
            timeout="connect")
    if isinstance(exc, (bce.ReadTimeoutError, asyncio.TimeoutError, *aio.timeout)):
        return StorageTimeoutError(
            f"no data from {redact(ctx.endpoint)}", received=received, timeout="idle"
        )
    if isinstance(exc, (bce.ResponseStreamingError, bce.IncompleteReadError,
                        *aio.payload)) or (
        received and isinstance(exc, (bce.ConnectionClosedError, *aio.connection))
    ):
        return IncompleteReadError(
            f"response body broken after {received} bytes ({type(exc).__name__})",
            received=received,
        )
    if type(exc).__module__ == "botocore.parsers" or (  # ResponseParserError & co.
            isinstance(exc, ValueError | KeyError | TypeError | IndexError)
            and _raised_in(exc, _PARSER_MODULES)):
        # botocore/aiohttp choking on a malformed answer (HEAD with a Content-Length
        # of 'abc'...): not retried, and nothing of the answer is echoed.
        return ProtocolError(f"S3 sent a malformed answer ({type(exc).__name__})")
    if isinstance(exc, (bce.EndpointConnectionError, bce.ConnectionClosedError,
                        bce.HTTPClientError, bce.ConnectionError, *aio.connection)):
        if (where := _address(exc)) is not None:
            # Named as the reads' own connections name it (a host or port typo shows;
            # without an endpoint, "AWS S3" said neither which host nor why).
            return ConnectionFailedError(f"cannot connect to {where[0]} ({where[1]})")
        return ConnectionFailedError(
            f"cannot reach {redact(ctx.endpoint)} ({type(exc).__name__})"
        )
    return exc


def _address(exc: BaseException) -> tuple[str, str] | None:
    """``host:port`` a connection that failed with ``exc`` was made to (never user info
    or a query: either may hold a secret), and its cause (``gaierror: [Errno -2] ...``);
    None where ``exc`` does not say (botocore's ``endpoint_url``, aiohttp's
    ``ClientConnectorError``)."""
    from urllib.parse import urlsplit

    kwargs = getattr(exc, "kwargs", None) or {}
    inner: BaseException = kwargs.get("error") or exc.__cause__ or exc
    host, port = getattr(inner, "host", None), getattr(inner, "port", None)
    if not (isinstance(host, str) and isinstance(port, int)):
        try:
            parts = urlsplit(str(kwargs.get("endpoint_url") or ""))
            host, port = parts.hostname, parts.port or {"https": 443, "http": 80}.get(
                parts.scheme)
        except ValueError:
            return None
    if not host or not port:
        return None
    cause = getattr(inner, "os_error", None) or inner
    if isinstance(cause, bce.BotoCoreError) and cause is exc:
        said = type(cause).__name__
    else:
        said = f"{type(cause).__name__}: {redact_text(str(cause))}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}", said


def _proxy_error(exc: BaseException, ctx: ErrorContext) -> TensorstreamError | None:
    """botocore's or aiohttp's error for the proxy's answer (a 407 to a forwarded
    request, a refused CONNECT) or for an unreachable proxy, naming the proxy: a
    refusal is not the endpoint failing, and is not retried."""
    status: Any = None
    if isinstance(exc, bce.ClientError):
        status = (exc.response or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 407:
            return None
    elif isinstance(exc, bce.ProxyConnectionError) or type(exc).__name__ == "ClientHttpProxyError":
        # aiohttp's error carries the CONNECT's status; urllib3's quotes http.client's
        refused = tunnel_refusal(exc)
        status = refused[0] if refused is not None else None
    else:
        return None
    if not isinstance(status, int):
        return ConnectionFailedError(f"cannot reach {redact(ctx.endpoint)} through the proxy "
                                     f"{ctx.proxy.label} ({type(exc).__name__})")
    err = ConnectionFailedError(f"the proxy {ctx.proxy.label} refused the request to "
                                f"{redact(ctx.endpoint)}: {status}{refusal_hint(status, ctx.proxy)}")
    err.temporary = False
    return err


@dataclasses.dataclass(frozen=True)
class _AiohttpErrors:
    ssl: tuple[type[BaseException], ...] = ()
    timeout: tuple[type[BaseException], ...] = ()
    payload: tuple[type[BaseException], ...] = ()
    connection: tuple[type[BaseException], ...] = ()


def _aiohttp_errors() -> _AiohttpErrors:
    """aiohttp's exception classes if aiohttp is loaded (only then can one be raised)."""
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None:
        return _AiohttpErrors()
    return _AiohttpErrors((aiohttp.ClientSSLError,), (aiohttp.ServerTimeoutError,),
                          (aiohttp.ClientPayloadError,), (aiohttp.ClientConnectionError,))


_PARSER_MODULES = ("botocore.", "aiobotocore.", "aiohttp.", "xml.", "dateutil.")


#: Where botocore resolves and refreshes credentials (and SSO tokens).
_CREDENTIAL_MODULES = ("botocore.credentials", "aiobotocore.credentials", "botocore.tokens",
                       "aiobotocore.tokens")


def from_credential_chain(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while botocore resolved or refreshed credentials
    (a ``credential_process`` run again, an SSO token, an assume-role call): it is
    mapped by :func:`map_session_error`, which withholds what a process printed."""
    if isinstance(exc, TensorstreamError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith(_CREDENTIAL_MODULES):
            return True
        tb = tb.tb_next
    return False


def _raised_in(exc: BaseException, modules: tuple[str, ...]) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in one of ``modules``."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = str(tb.tb_frame.f_globals.get("__name__", ""))
    return name.startswith(modules)



#: botocore errors of setting up a session whose messages name only files and profiles.
_SAFE_SETUP_ERRORS = (bce.ConfigParseError, bce.InfiniteLoopConfigError, bce.ProfileNotFound,
                      bce.InvalidConfigError, bce.ConfigNotFound)


def map_session_error(exc: BaseException, profile: str | None, files: str,
                      profile_source: str = "") -> BaseException:
    """The tensorstream error for ``exc``, raised while botocore set up a session
    or resolved credentials for ``profile`` (named by ``profile_source``) from
    ``files`` (returned, not raised).

    A message that may hold what a credential source printed (a
    ``credential_process``'s stderr, its unparsable output) is withheld, and
    ``exc`` is scrubbed of it, since it is chained as the cause."""
    if isinstance(exc, TensorstreamError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, bce.ProfileNotFound):
        # botocore also reads AWS_PROFILE where the keys came from elsewhere (``profile``
        # is then None): the name is the one botocore looked for.
        name = profile or str(exc.kwargs.get("profile") or "")
        if not profile_source:
            named_by = [v for v in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE")
                        if os.environ.get(v) == name]
            profile_source = f"env {named_by[0]}" if named_by else "botocore"
        if not name and profile_source.startswith("env "):
            # botocore (boto3 and the aws CLI alike) takes an empty variable for a profile
            # named '': "AWS profile '' ... is not defined" told nobody what to do
            return ConfigurationError(
                f"{profile_source} is set but empty, which botocore takes for a profile named "
                f"''; unset {profile_source[4:]}, or name a profile in it")
        return ConfigurationError(
            f"AWS profile {name!r} ({profile_source}) is not defined in {files}")
    if isinstance(exc, bce.PartialCredentialsError):
        return _half_pair(exc, profile)
    # botocore configures itself from AWS_PROFILE where the keys came from elsewhere
    where = f"AWS profile {profile or config_profile_name(None, os.environ)!r} ({files})"
    if isinstance(exc, (bce.SSOTokenLoadError, bce.UnauthorizedSSOTokenError)):
        _withhold(exc)
        return ConfigurationError(
            f"{where}: its SSO token is missing or expired; run "
            f"'aws sso login --profile {profile or 'default'}'")
    if isinstance(exc, _SAFE_SETUP_ERRORS):
        # Its own message names files and profiles; what it was raised from may quote the
        # file (a UnicodeDecodeError holds all its bytes).
        exc.__cause__ = exc.__context__ = None
        _keep_only(exc, {"path", "profile", "source_profile", "visited_profiles", "error_msg"})
        return ConfigurationError(f"{where}: {redact_text(str(exc))}")
    if isinstance(exc, (bce.ConnectionError, bce.ReadTimeoutError, bce.HTTPClientError)):
        # An endpoint the chain fetches keys from (STS for a role_arn, SSO, container or
        # instance metadata) that does not answer. botocore's client for it has retried
        # already: retrying that again, 5 times over, took 41 s to say "cannot reach  ".
        url = getattr(exc, "kwargs", {}).get("endpoint_url")
        err = ConnectionFailedError(
            f"{where}: botocore's credential chain cannot reach "
            f"{redact(str(url)) if url else 'the endpoint it fetches keys from'} "
            f"({type(exc).__name__}; STS for role_arn/source_profile, SSO, container or "
            "instance metadata)")
        err.temporary = False
        return err
    if type(exc) is RuntimeError and str(exc) == _STILL_EXPIRED:
        # botocore's own fixed text; said bare as "RuntimeError ... run it by hand", no
        # word of an expiry or of which source returned the stale keys
        exc.__cause__ = exc.__context__ = None
        return ConfigurationError(
            f"{where}: {_refreshed_by(exc, profile)} returned temporary credentials whose "
            "Expiration is already past, and again when asked once more; make it return "
            "fresh ones (a cached answer not renewed?) or check this machine's clock")
    if _bad_expiration(exc):
        source = _refreshed_by(exc, profile)
        _withhold(exc)
        return ConfigurationError(
            f"{where}: {source} returned an Expiration that is not a time with its zone "
            "(ISO 8601, as 2026-01-01T00:00:00Z); what it printed is not shown")
    if isinstance(exc, bce.InvalidRegionError):  # the profile's (variables are checked before)
        return ConfigurationError(
            f"{where}: region {exc.kwargs.get('region_name')!r} is not a region name (letters, "
            "digits and '-', e.g. us-east-1)")
    if isinstance(exc, bce.NoRegionError):
        return ConfigurationError(
            f"{where}: botocore's credential chain needs a region (for STS): set region in "
            "the profile, or AWS_DEFAULT_REGION")
    if isinstance(exc, bce.BotoCoreError):
        mapped = map_s3_error(exc, ErrorContext("", "", ""))
        if mapped is not exc:
            return mapped
    provider = getattr(exc, "kwargs", {}).get("provider") if isinstance(exc, bce.BotoCoreError) \
        else None
    if isinstance(exc, bce.CredentialRetrievalError) and provider in _SOURCE_HINTS:
        # botocore's own words name only the profile; the generic message below said
        # "what it printed is withheld ... run it by hand", of the environment
        named = re.search(r"referenced in profile (\S+)$", str(exc.kwargs.get("error_msg")))
        name = named.group(1) if named else profile or config_profile_name(None, os.environ)
        exc.__cause__ = exc.__context__ = None
        file = profile_setting_file(name, "credential_source", os.environ)
        return ConfigurationError(
            f"{where}: {file} [profile {name}] credential_source = {provider} found no keys "
            f"to assume its role with: {_SOURCE_HINTS[str(provider)]}")
    _withhold(exc)
    source = f"its credential source {provider!r}" if provider else "botocore's credential chain"
    return ConfigurationError(
        f"{where}: {source} failed ({type(exc).__name__}; what it printed is withheld, "
        "it may hold secrets: run it by hand to see why)")


#: What each ``credential_source`` of a role profile (botocore's three) found nothing in.
_SOURCE_HINTS = {
    "Environment": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "Ec2InstanceMetadata": "no EC2 instance metadata service answered with a role's keys "
                           "(or AWS_EC2_METADATA_DISABLED is true)",
    "EcsContainer": "no container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or "
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI) answered",
}
#: botocore's (and aiobotocore's) RuntimeError when a refresh returned expired credentials.
_STILL_EXPIRED = "Credentials were refreshed, but the refreshed credentials are still expired."


def _refreshed_by(exc: BaseException, profile: str | None) -> str:
    """The source whose refresh raised ``exc``, from the refreshable credentials in its
    traceback (e.g. ``~/.aws/config [profile ci] credential_process (botocore
    custom-process)``), else botocore's credential chain."""
    found = None
    tb = exc.__traceback__
    while tb is not None:  # the innermost (a role's source_profile's process, say)
        holder = tb.tb_frame.f_locals.get("self")
        method = getattr(holder, "method", None) or getattr(holder, "METHOD", None)
        # (a credentials object or provider: a request's ``method`` is an HTTP verb)
        if isinstance(method, str) and method \
                and type(holder).__module__.startswith(_CREDENTIAL_MODULES):
            found = method
        tb = tb.tb_next
    return chain_source(found, profile) if found else "botocore's credential chain"


def _bad_expiration(exc: BaseException) -> bool:
    """Whether ``exc`` was raised reading a credential source's ``Expiration`` (dateutil's
    ParserError for ``never``, a TypeError comparing one without a zone to now)."""
    if not isinstance(exc, (ValueError, TypeError, OverflowError)):
        return False
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code.co_name
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if code in _EXPIRY_READERS and module.startswith(_CREDENTIAL_MODULES):
            return True
        tb = tb.tb_next
    return False


#: botocore's functions that parse an Expiration or compare it with now.
_EXPIRY_READERS = frozenset({"_expiry_datetime", "_parse_if_needed", "_seconds_remaining",
                             "_is_expired", "refresh_needed"})


#: botocore's credential providers that read a file, and which file.
_PROVIDER_FILES = {"shared-credentials-file": "credentials", "config-file": "config"}


def _half_pair(exc: bce.PartialCredentialsError, profile: str | None) -> ConfigurationError:
    """A key pair botocore found half of: the file, the profile and both halves named."""
    provider = str(exc.kwargs.get("provider") or "")
    missing = str(exc.kwargs.get("cred_var") or "")
    which = _PROVIDER_FILES.get(provider)
    if which:  # the file botocore read (config.py's rule; not imported: a cycle)
        var = "AWS_SHARED_CREDENTIALS_FILE" if which == "credentials" else "AWS_CONFIG_FILE"
        where = f"{os.environ.get(var) or f'~/.aws/{which}'} [profile {profile or 'default'}]"
    else:
        where = f"botocore's {provider!r} credentials"
    have = {"aws_secret_access_key": "aws_access_key_id",
            "AWS_SECRET_ACCESS_KEY": "AWS_ACCESS_KEY_ID"}.get(missing, "the other half")
    return ConfigurationError(f"{where} sets {have} but not {missing}; an S3 key pair must "
                              "come whole from one source (set both, or neither)")


def _withhold(exc: BaseException) -> None:
    """Drop what ``exc`` says beyond its type (it may quote a credential source's output)."""
    try:
        exc.args = (f"{type(exc).__name__} (withheld: may hold secrets)",)
        _keep_only(exc, {"provider"})
        if hasattr(exc, "doc"):  # json.JSONDecodeError keeps the whole text it parsed
            exc.doc = ""
    except Exception:  # pragma: no cover - an exception type with read-only fields
        pass
    exc.__cause__ = exc.__context__ = None


def _keep_only(exc: BaseException, names: set[str]) -> None:
    """Drop the fields of a botocore error's ``kwargs`` not in ``names`` (ConfigParseError
    keeps the parser's error, whose UnicodeDecodeError holds the file's bytes)."""
    kwargs = getattr(exc, "kwargs", None)
    if isinstance(kwargs, dict):
        for key in [k for k in kwargs if k not in names]:
            del kwargs[key]
