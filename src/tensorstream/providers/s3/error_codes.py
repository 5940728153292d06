"""S3's error answers -> tensorstream.errors: the code and status of a botocore
``ClientError`` and the XML error body of a raw S3 HTTP answer go through one
table (:func:`map_client_error`), with :class:`ErrorContext` saying what a
message may name. :mod:`.errors` maps every other exception and re-exports these."""

from __future__ import annotations

import dataclasses
from typing import Any
from xml.etree import ElementTree

import botocore.exceptions as bce

from ..._client_cert import CLIENT_CERT_OPTIONS, NGINX_NO_CERTIFICATE
from ..._log_redaction import withhold, withhold_args
from ...errors import (
    ConfigurationError,
    InvalidRangeError,
    InvalidURIError,
    NotFoundError,
    ObjectChangedError,
    PermissionDeniedError,
    ServiceUnavailableError,
    TensorstreamError,
)
from ...uri import redact, redact_text
from .._http.header_values import parse_retry_after
from .._http.status_errors import bad_request_advice

__all__ = ["ErrorContext", "WrongRegionError", "map_client_error", "map_s3_http_error"]

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload", "NoSuchVersion", "404"}
_DENIED = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "403",
}
#: ``ConditionalRequestConflict`` (409): a conditional write or delete lost to a request
#: that changed the object first (S3's words: "a conflicting operation occurred").
_CHANGED = {"PreconditionFailed", "412", "ConditionalRequestConflict"}
_RANGE = {"InvalidRange", "416"}
_BUSY = {
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
    "ThrottlingException", "TooManyRequests", "RequestLimitExceeded", "OperationAborted",
    "503", "500", "502", "504", "429",
}
#: A throttle in the server's own words: the request was turned away, not applied.
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
              "RequestLimitExceeded"}
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



def map_client_error(exc: bce.ClientError, ctx: ErrorContext) -> TensorstreamError:
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
    if code == "NoSuchUpload":  # (the key was being written, not read: no "no such object")
        return NotFoundError(f"the multipart upload is gone ({detail}): completed, or aborted "
                             "by another (a lifecycle rule, abort-multipart-upload)")
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
        busy = ServiceUnavailableError(f"S3 is unavailable or throttling ({detail})",
                                       retry_after=_retry_after(meta))
        busy.not_applied = code in _THROTTLED
        return busy
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
    return map_client_error(bce.ClientError(response, "GetObject"), ctx)  # type: ignore[arg-type]


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
