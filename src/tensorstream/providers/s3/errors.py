"""The S3 provider's one error-mapping function: botocore/aiohttp -> tensorstream.errors.

aiohttp errors only come from aiobotocore (list, delete, writes); it is not
imported here, so a read-only process never loads it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from typing import Any
from xml.etree import ElementTree

import botocore.exceptions as bce

from ..._client_cert import CLIENT_CERT_OPTIONS, NGINX_NO_CERTIFICATE
from ..._log_redaction import withhold, withhold_args
from ...errors import (
    ConfigurationError,
    ConnectionFailedError,
    IncompleteReadError,
    InvalidRangeError,
    InvalidURIError,
    MissingCredentialsError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    ProtocolError,
    ServiceUnavailableError,
    StorageTimeoutError,
    TensorstreamError,
)
from ...uri import redact, redact_text
from .._http.header_values import parse_retry_after
from .._http.proxies import refusal_hint, tunnel_refusal
from .._http.status_errors import bad_request_advice, plain_text_answer
from .profile import config_profile_name

__all__ = ["ErrorContext", "WrongRegionError", "from_credential_chain", "map_s3_error", "map_s3_http_error",
           "map_session_error"]

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload", "NoSuchVersion", "404"}
_DENIED = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "403",
}
_CHANGED = {"PreconditionFailed", "412"}
_RANGE = {"InvalidRange", "416"}
_BUSY = {
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
    "ThrottlingException", "TooManyRequests", "RequestLimitExceeded", "OperationAborted",
    "503", "500", "502", "504", "429",
}
_BAD_NAME = {"InvalidBucketName", "KeyTooLongError"}
#: S3's answers to a request sent to (or signed for) a region the bucket is not in.
_WRONG_REGION = {"PermanentRedirect", "TemporaryRedirect", "AuthorizationHeaderMalformed",
                 "IllegalLocationConstraintException"}


class WrongRegionError(ConfigurationError):
    """The bucket is in another region than the one requests were signed for;
    :attr:`region` is the bucket's region where S3 named it (else ``""``)."""

    def __init__(self, message: str, region: str = "") -> None:
        super().__init__(message)
        self.region = region


@dataclasses.dataclass(frozen=True)
class ErrorContext:
    """What an error message may name: never a secret."""

    path: str
    credential_source: str
    endpoint: str
    #: The secret key and session token in use: a server's error message that
    #: echoes one (a hostile or broken endpoint) has it masked.
    secrets: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)
    #: The region requests were signed for ("" when not known).
    region: str = ""
    #: The proxy requests to the endpoint go through (``Proxy``), or ``None``.
    proxy: Any = None

    def withhold(self, text: str) -> str:
        """``text`` with every secret of :attr:`secrets` in it masked."""
        return withhold(text, self.secrets)

    def withhold_in(self, exc: BaseException) -> None:
        """Mask the secrets in a botocore error in place (its message and the
        parsed ``Error`` of a ``ClientError``): it stays the mapped error's
        cause, and a server may have echoed a secret into it."""
        if not self.secrets:
            return
        withhold_args(exc, self.secrets)
        error = (getattr(exc, "response", None) or {}).get("Error")
        if isinstance(error, dict):
            for name, value in error.items():
                if isinstance(value, str):
                    error[name] = self.withhold(value)


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
        return _map_client_error(exc, ctx)
    if isinstance(exc, bce.PartialCredentialsError):
        return ConfigurationError(
            f"half of an S3 key pair in {exc.kwargs.get('provider')}: "
            f"{exc.kwargs.get('cred_var')} is missing; set both, or neither"
        )
    if isinstance(exc, bce.NoCredentialsError):
        return MissingCredentialsError("no S3 credentials found")
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
        return StorageTimeoutError(f"connect timeout to {redact(ctx.endpoint)}",
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
        return ConnectionFailedError(
            f"cannot reach {redact(ctx.endpoint)} ({type(exc).__name__})"
        )
    return exc


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


def _map_client_error(exc: bce.ClientError, ctx: ErrorContext) -> TensorstreamError:
    response: dict[str, Any] = exc.response or {}
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = str(error.get("Code") or "")
    status = meta.get("HTTPStatusCode")
    text = ctx.withhold(str(error.get("Message") or "").strip())
    code = ctx.withhold(code)
    label = code or str(status or "error")
    detail = f"{label}: {text}" if text and text != label else label
    keys = {code, str(status)}

    wrong_region = _wrong_region(code, status, error, meta, ctx)
    if wrong_region is not None:
        return wrong_region
    if code == "NoSuchBucket":
        bucket = ctx.path.split("/", 1)[0]
        named = f" {bucket!r}" if bucket else ""
        return NotFoundError(f"no such bucket{named} at {redact(ctx.endpoint)} ({detail})")
    if keys & _NOT_FOUND:
        # s3fs and pyarrow read s3://b/k?versionId=v as version v of k; here the key is
        # every character after the bucket (aws-cli's rule), and that key is absent.
        version = ("; the key is every character after the bucket, '?versionId=' included "
                   "(reading an object version by URI is not supported)"
                   if "?versionid=" in ctx.path.lower() else "")
        return NotFoundError(f"no such object ({detail}){version}")
    if keys & _DENIED:
        return PermissionDeniedError(
            f"S3 refused the request ({detail}); credentials from {ctx.credential_source}, "
            f"endpoint {redact(ctx.endpoint)}"
        )
    if keys & _CHANGED:
        return ObjectChangedError(f"object changed while it was being read ({label})")
    if keys & _RANGE:
        return InvalidRangeError(f"requested range is past the end of the object ({label})")
    if keys & _BUSY or (isinstance(status, int) and status >= 500):
        return ServiceUnavailableError(f"S3 is unavailable or throttling ({detail})",
                                       retry_after=_retry_after(meta))
    if code in _BAD_NAME:
        return InvalidURIError(f"invalid S3 bucket or key ({detail})")
    if status == 400 or code:
        return ConfigurationError(f"S3 rejected the request ({detail})")
    return TensorstreamError(f"S3 request failed ({detail})")


def _wrong_region(code: str, status: Any, error: dict[str, Any], meta: dict[str, Any],
                  ctx: ErrorContext) -> WrongRegionError | None:
    """The error for a bucket in another region than the one requests were signed
    for (a 301 ``PermanentRedirect``, a 400 ``AuthorizationHeaderMalformed``, or a
    HEAD's bare 301/400 with ``x-amz-bucket-region``), naming the bucket's region
    and how to set it; else ``None``. The provider's reads follow the region once
    (as boto3 does); this error is what stands when that is not possible."""
    headers = {str(k).lower(): v for k, v in (meta.get("HTTPHeaders") or {}).items()}
    region = str(headers.get("x-amz-bucket-region") or error.get("Region") or "").strip()
    if not region.replace("-", "").isalnum() or len(region) > 40:  # only a region name is quoted
        region = ""
    if code not in _WRONG_REGION and not (region and status in (301, 307, 400)
                                          and code in ("", str(status))):
        return None
    if region and region == ctx.region:
        if code not in ("PermanentRedirect", "TemporaryRedirect", "301", "307"):
            return None  # not about the region (a 400 of an SSE-C HEAD, say)
        return WrongRegionError(
            f"bucket {ctx.path.split('/', 1)[0]!r} is in region {region!r} and requests are "
            f"signed for it, but {redact(ctx.endpoint)} answers {code or status} (it serves "
            "another region): set the endpoint to that region's (s3_endpoint, "
            "AWS_ENDPOINT_URL_S3), or unset it")
    if not region and code == "AuthorizationHeaderMalformed":
        return None  # malformed for another reason than the region (it names none)
    bucket = ctx.path.split("/", 1)[0]
    named = f"bucket {bucket!r}" if bucket else "the bucket"
    signed = f" requests were signed for {ctx.region!r};" if ctx.region else ""
    if region:
        return WrongRegionError(
            f"{named} is in region {region!r}, not the one configured:{signed} set "
            f"s3_region={region!r} (or AWS_REGION={region}) ({code or status} from "
            f"{redact(ctx.endpoint)})", region)
    return WrongRegionError(
        f"{named} is in another region than the one configured:{signed} set s3_region "
        f"(or AWS_REGION) to the bucket's region ({code or status} from "
        f"{redact(ctx.endpoint)})")


def _retry_after(meta: dict[str, Any]) -> float | None:
    # The HTTP provider's parser: finite non-negative seconds or an HTTP date.
    return parse_retry_after((meta.get("HTTPHeaders") or {}).get("retry-after"))


def map_s3_http_error(status: int, headers: Any, body: bytes, ctx: ErrorContext) -> TensorstreamError:
    """The tensorstream error for a raw S3 HTTP answer (the blocking data path):
    its XML error body (``Code``/``Message``) goes through the same table as
    botocore's ``ClientError``. Nothing else of the body (which may echo the
    string to sign) reaches a message."""
    code = message = region = ""
    if body:
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            root = None
        if root is not None:
            code = (root.findtext("Code") or "").strip()
            message = (root.findtext("Message") or "").strip()
            region = (root.findtext("Region") or "").strip()
    retry_after = headers.get("Retry-After") if headers is not None else None
    bucket_region = headers.get("x-amz-bucket-region") if headers is not None else None
    response: dict[str, Any] = {
        "Error": {"Code": code or str(status), "Message": redact_text(message),
                  "Region": region},
        "ResponseMetadata": {
            "HTTPStatusCode": status,
            "HTTPHeaders": {k: v for k, v in (("retry-after", retry_after),
                                              ("x-amz-bucket-region", bucket_region)) if v},
        },
    }
    if status == 400 and not code:  # no S3 error: a 400 of the server in front (nginx)
        advice = _nginx_400(headers, body, ctx)
        if advice is not None:
            return ConfigurationError(f"S3 rejected the request (400): {advice}")
    return _map_client_error(bce.ClientError(response, "GetObject"), ctx)  # type: ignore[arg-type]


def _nginx_400(headers: Any, body: bytes, ctx: ErrorContext) -> str | None:
    """What nginx's own 400 (no S3 error code) means: its page says it (a GET); a
    HEAD's has no page, so a bare 400 from nginx over TLS is said to be what nginx
    answers for a missing client certificate, the usual cause."""
    advice = bad_request_advice(body)
    if advice is not None or body:
        return advice
    server = str(headers.get("Server") or "") if headers is not None else ""
    if server.lower().startswith("nginx") and ctx.endpoint.lower().startswith("https://"):
        return (f"nginx answers a bare 400 like this ('{NGINX_NO_CERTIFICATE}') when it "
                f"requires a TLS client certificate and got none: if it does, pass "
                f"{CLIENT_CERT_OPTIONS}")
    return None


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
    _withhold(exc)
    source = f"its credential source {provider!r}" if provider else "botocore's credential chain"
    return ConfigurationError(
        f"{where}: {source} failed ({type(exc).__name__}; what it printed is withheld, "
        "it may hold secrets: run it by hand to see why)")


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
