"""Presigned URLs and unsigned requests on the signature-checking moto server.

moto checks only an ``Authorization`` header: a presigned URL (SigV4's
``X-Amz-Signature`` or SigV2's ``Signature`` in the query, as
``generate_presigned_url`` and tensorizer's curl reads make) or an unsigned
request made it fail with ``KeyError: 'HTTP_AUTHORIZATION'``, a 500 HTML page.
This WSGI middleware, in moto's child process, checks a presigned URL as S3
does (key id, signature with botocore's signers, expiry) and hands moto the
request signed again in the header with the same keys; an unsigned request is
``AccessDenied``, as S3 answers one for a private bucket.
"""

from __future__ import annotations

import datetime
import hmac
import io
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["QueryAuth"]

_V4_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
              "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token")
_V2_PARAMS = ("AWSAccessKeyId", "Signature", "Expires")


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class QueryAuth:
    """Wraps moto's WSGI app; :attr:`keys` (id, secret) is set once moto made them."""

    def __init__(self, app: Callable[..., Iterable[bytes]], region: str) -> None:
        self.app = app
        self.region = region
        self.keys: tuple[str, str] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if self.keys is None or environ.get("HTTP_AUTHORIZATION"):
            return self.app(environ, start_response)
        query = environ.get("QUERY_STRING", "")
        pairs = [p.partition("=") for p in query.split("&") if p]
        names = {urllib.parse.unquote(k) for k, _, _ in pairs}
        try:
            if "X-Amz-Signature" in names:
                self._check_v4(environ, pairs)
            elif "Signature" in names and "AWSAccessKeyId" in names:
                self._check_v2(environ, pairs)
            else:
                raise _Refused("AccessDenied", "Access Denied (the request is not signed)")
        except _Refused as exc:
            body = ("<?xml version='1.0' encoding='UTF-8'?><Error>"
                    f"<Code>{exc.code}</Code><Message>{exc}</Message></Error>").encode()
            start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                             ("Content-Length", str(len(body)))])
            return [body]
        self._sign_in_header(environ, pairs)
        return self.app(environ, start_response)

    # -- checks ---------------------------------------------------------------------------

    def _own_key(self, key_id: str) -> str:
        assert self.keys is not None
        if key_id != self.keys[0]:
            raise _Refused("InvalidAccessKeyId", "The AWS Access Key Id you provided does "
                           "not exist in our records.")
        return self.keys[1]

    def _check_v4(self, environ: dict[str, Any], pairs: list[tuple[str, str, str]]) -> None:
        from botocore.auth import S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        params = {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, _, v in pairs}
        key_id, _, scope = params.get("X-Amz-Credential", "").partition("/")
        secret = self._own_key(key_id)
        stamp = params.get("X-Amz-Date", "")
        try:
            signed_at = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.timezone.utc)
            expires = int(params.get("X-Amz-Expires", ""))
        except ValueError:
            raise _Refused("AuthorizationQueryParametersError",
                           "X-Amz-Date or X-Amz-Expires is malformed") from None
        _expired(signed_at + datetime.timedelta(seconds=expires))
        region = scope.split("/")[1] if scope.count("/") >= 1 else self.region
        unsigned = "&".join(f"{k}={v}" for k, _, v in pairs
                            if urllib.parse.unquote(k) != "X-Amz-Signature")
        headers = {h: _header(environ, h) for h in params.get("X-Amz-SignedHeaders", "host").split(";")}
        request = AWSRequest(method=environ["REQUEST_METHOD"],
                             url=f"http://{_header(environ, 'host')}{_raw_path(environ)}?{unsigned}",
                             headers=headers)
        request.context["timestamp"] = stamp
        auth = S3SigV4QueryAuth(Credentials(key_id, secret), "s3", region, expires=expires)
        string_to_sign = auth.string_to_sign(request, auth.canonical_request(request))
        _same(auth.signature(string_to_sign, request), params["X-Amz-Signature"])

    def _check_v2(self, environ: dict[str, Any], pairs: list[tuple[str, str, str]]) -> None:
        from botocore.auth import HmacV1Auth
        from botocore.credentials import Credentials

        params = {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, _, v in pairs}
        secret = self._own_key(params["AWSAccessKeyId"])
        try:
            expires = int(params.get("Expires", ""))
        except ValueError:
            raise _Refused("AccessDenied", "Expires is malformed") from None
        _expired(datetime.datetime.fromtimestamp(expires, datetime.timezone.utc))
        rest = "&".join(f"{k}={v}" for k, _, v in pairs
                        if urllib.parse.unquote(k) not in _V2_PARAMS)
        split = urllib.parse.urlsplit(f"http://h{_raw_path(environ)}?{rest}")
        headers = {name: _header(environ, name) for name in ("content-md5", "content-type")
                   if _header(environ, name)}
        headers.update({k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                        if k.startswith("HTTP_X_AMZ_")})
        class _Signer(HmacV1Auth):
            def _get_date(self) -> str:  # the query's Expires takes the Date's place
                return str(expires)

        auth = _Signer(Credentials(params["AWSAccessKeyId"], secret))
        _same(auth.get_signature(environ["REQUEST_METHOD"], split, _Headers(headers)),
              params["Signature"])

    # -- handing it to moto ---------------------------------------------------------------

    def _sign_in_header(self, environ: dict[str, Any], pairs: list[tuple[str, str, str]]) -> None:
        """The presigned request, signed in its header with the same (checked) keys.

        moto recomputes the signature from the raw path, the query, the signed headers
        and the body, so all four go in as moto will see them."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        assert self.keys is not None
        query = "&".join(f"{k}={v}" if s else k for k, s, v in pairs
                         if urllib.parse.unquote(k) not in _V4_PARAMS + _V2_PARAMS)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["QUERY_STRING"] = query
        path = _raw_path(environ)
        for name in ("RAW_URI", "REQUEST_URI"):
            if name in environ:
                environ[name] = path + (f"?{query}" if query else "")
        request = AWSRequest(method=environ["REQUEST_METHOD"],
                             url=path + (f"?{query}" if query else ""), data=body,
                             headers={"Host": _header(environ, "host")})
        S3SigV4Auth(Credentials(*self.keys), "s3", self.region).add_auth(request)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256"):
            environ["HTTP_" + name.upper().replace("-", "_")] = request.headers[name]


class _Headers(dict):  # type: ignore[type-arg]
    """HmacV1Auth reads headers case-insensitively through ``get_all``."""

    def get_all(self, name: str) -> list[str]:
        value = self.get(name.lower())
        return [] if value is None else [value]


def _header(environ: dict[str, Any], name: str) -> str:
    key = name.upper().replace("-", "_")
    if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        return str(environ.get(key, ""))
    return str(environ.get("HTTP_" + key, ""))


def _raw_path(environ: dict[str, Any]) -> str:
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw).partition("?")[0]
    return urllib.parse.quote(environ.get("PATH_INFO", ""))


def _expired(at: datetime.datetime) -> None:
    if datetime.datetime.now(datetime.timezone.utc) > at:
        raise _Refused("AccessDenied", "Request has expired")


def _same(expected: str, given: str) -> None:
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise _Refused("SignatureDoesNotMatch", "The request signature we calculated does "
                       "not match the signature you provided. Check your key and signing method.")
