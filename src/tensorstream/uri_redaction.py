"""Secrets out of URIs and out of text holding URIs: :func:`redact` (one URI) and
:func:`redact_text` (log lines, messages, errors). Userinfo passwords (the whole userinfo
for S3, a lone user name for HTTP(S) and Redis), tokens and presigned query parameters
become ``***``; an HTTP(S) URL's query loses every value, whatever its name (a token
travels under any name), its names kept. Done on the raw text, before any URL parsing, so a password holding
``?``, ``#`` or ``/`` is not taken for the query or path. :mod:`tensorstream.uri` names
all of it too (its old home)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable

__all__ = ["SECRET_API_PARAMS", "SECRET_HEADERS", "SECRET_QUERY_PARAMS", "authority_end",
           "is_secret_param", "redact", "redact_text", "secret_query_values"]

#: Request headers whose values are credentials (lower case), the one list: masked in
#: third-party log lines and error texts (:mod:`tensorstream._log_redaction`) and in the
#: test servers' request reprs. An SSE-C key is the object's key itself; its MD5 names it.
SECRET_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", "x-api-key", "x-amz-security-token",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-server-side-encryption-customer-key-md5",
    "x-amz-copy-source-server-side-encryption-customer-key",
    "x-amz-copy-source-server-side-encryption-customer-key-md5",
})
#: The same secrets as botocore's API parameters, which it logs at DEBUG before it turns
#: them into those headers (``'SSECustomerKey': '...'``).
SECRET_API_PARAMS = frozenset({"SSECustomerKey", "SSECustomerKeyMD5", "CopySourceSSECustomerKey",
                               "CopySourceSSECustomerKeyMD5"})

#: Query parameters whose values are credentials (compared case-insensitively).
SECRET_QUERY_PARAMS = frozenset(
    p.lower()
    for p in (
        "X-Amz-Signature",
        "X-Amz-Credential",
        "X-Amz-Security-Token",
        "Signature",
        "token",
        "access_token",
        "sig",
        "password",
        "secret",
        "key",
        "api_key",
        "apikey",
        "x-goog-signature",
        "x-goog-credential",
        "AWSAccessKeyId",
        # Other common names for a token or password in a URL (Firebase's ``auth``,
        # GitLab's ``private_token``, OAuth's, ...): shown in cp's output and errors.
        "auth",
        "access_key",
        "secret_key",
        "private_token",
        "refresh_token",
        "id_token",
        "session_token",
        "client_secret",
        "jwt",
        "passwd",
        "pwd",
        "sv",
        "se",
        "sp",
    )
)
_SECRET_PARAM_EXCEPTIONS = frozenset({"sv", "se", "sp"})  # Azure SAS: 'sig' is the secret
_REDACTED = "***"


#: Words that make any parameter's name a credential (its ``-``, ``_`` and ``.`` left out):
#: ``aws_session_token``, ``X-Api-Key``, ``Subscription-Key``, ``client_credentials``,
#: ``jsessionid``, ``PHPSESSID``... (the fixed list above missed every name it did not spell).
_SECRET_NAME_WORDS = ("token", "secret", "signature", "password", "passwd", "passphrase",
                      "credential", "apikey", "accesskey", "secretkey", "privatekey",
                      "subscriptionkey", "authkey", "session", "sessid")
_NAME_SEPARATORS = re.compile(r"[-_.\s]")
#: How many times a parameter's value is percent-decoded looking for a secret inside.
_MAX_DECODES = 4
_MAY_HOLD_SECRET = re.compile(r"[=@]").search


def is_secret_param(name: str) -> bool:
    """Whether a query (or fragment) parameter named ``name`` holds a credential: a name
    in :data:`SECRET_QUERY_PARAMS` or one holding a credential word, in any case,
    percent-encoded or not."""
    lname = urllib.parse.unquote(name).lower()
    if lname in _SECRET_PARAM_EXCEPTIONS:
        return False
    squashed = _NAME_SEPARATORS.sub("", lname)
    return lname in SECRET_QUERY_PARAMS or any(w in squashed for w in _SECRET_NAME_WORDS)


#: Query parameters whose values are no secret in any URL that carries them (a presigned
#: URL's algorithm, date and lifetime; S3's response overrides): not remembered as
#: secrets by :func:`secret_query_values` with ``every_name``, where masking them would
#: hide a content type or a date in every third-party log line.
_PUBLIC_QUERY_PARAMS = frozenset({
    "x-amz-algorithm", "x-amz-date", "x-amz-expires", "x-amz-signedheaders", "expires",
    "response-content-type", "response-content-disposition", "response-content-encoding",
    "response-content-language", "response-cache-control", "response-expires",
})


#: A value that may be a token whatever its name: this long, no space, and digits and
#: letters, or letters of both cases (a random base64 token of 22 characters holds no
#: digit one time in 40).
_TOKEN_LIKE = re.compile(
    r"(?:(?=\S*[0-9])(?=\S*[A-Za-z])|(?=\S*[a-z])(?=\S*[A-Z]))\S{16,}").fullmatch


#: A file name or path (``model-00001-of-00002.safetensors``, ``llama/config.json``): it
#: ends in an extension (lower case, as weights' and configs' are). No token does: base64
#: and hex hold no '.', a JWT ends in its signature (43 characters and more), and a token
#: of two parts whose short tail is all lower case is rare (``session.AbC12dEf9`` is one).
_FILE_NAME = re.compile(r".*\.[a-z][a-z0-9_]{0,11}", re.DOTALL).fullmatch


def _token_like(value: str) -> bool:
    """Whether a query value may be a token (``f00dfeed...``, a JWT, base64): remembering
    a plain word or name (``?file=model.safetensors``, ``?region=us-east-1``, a shard's
    ``model-00001-of-00002.safetensors``) masked it in every later error that names it."""
    text = urllib.parse.unquote(value)
    return _TOKEN_LIKE(text) is not None and _FILE_NAME(text) is None


def secret_query_values(target: str, *, every_name: bool = False) -> list[str]:
    """The values of ``target``'s (``/path?query``) secret parameters, as sent and
    percent-decoded (a ``+`` kept, and as a space): what a server echoing one alone (not
    after its name) shows.
    ``every_name``: those of every parameter whose value may be a token (an HTTP(S)
    URL's: a token travels under any name, ``?hmac=``), but the few never secret.

    >>> secret_query_values("/m?X-Amz-Signature=ab%2Fcd&n=1")
    ['ab%2Fcd', 'ab/cd']
    >>> secret_query_values("/m?hmac=0123456789abcdef&X-Amz-Date=20261207T000000Z&f=a.bin",
    ...                     every_name=True)
    ['0123456789abcdef']
    """
    query = target.partition("?")[2].partition("#")[0]
    out: list[str] = []
    for part in re.split(r"[&;]", query):
        name, sep, value = part.partition("=")
        if not (sep and value):
            continue
        if is_secret_param(name) or (every_name and _token_like(value) and (
                urllib.parse.unquote(name).lower() not in _PUBLIC_QUERY_PARAMS)):
            # (a server may decode a '+' as a space, as a form's query does)
            out += dict.fromkeys((value, urllib.parse.unquote(value),
                                  urllib.parse.unquote_plus(value)))
    return out


def _holds_secret(raw: str) -> bool:
    """Whether ``raw`` (a parameter's value) holds a secret as it is or percent-decoded
    (up to :data:`_MAX_DECODES` times): a URL with userinfo or a presigned query, or a
    ``name=value``, passed inside a parameter (``?next=https://u:pw@h/``,
    ``?next=https%3A...%3FX-Amz-Signature%3D...``)."""
    # (a secret needs a '=' or an '@' around it: anything else is not probed)
    if "://" in raw and _MAY_HOLD_SECRET(raw):
        probe = "?" + raw
        if _redact_text(probe, decode=False) != probe:
            return True
    text = raw
    for _ in range(_MAX_DECODES):
        if "%" not in text:
            return False
        decoded = urllib.parse.unquote(text)
        if decoded == text:
            return False
        probe = "?" + decoded  # a bare ``name=value`` is a parameter too
        # (not decoding again inside: this loop does, at most _MAX_DECODES times in all)
        if _MAY_HOLD_SECRET(decoded) and _redact_text(probe, decode=False) != probe:
            return True
        text = decoded
    return False


def _redact_param(part: str, decode: bool) -> str:
    """One ``name=value`` of a query or fragment, its value hidden where it is a secret."""
    name, sep, value = part.partition("=")
    if sep and is_secret_param(name):
        return f"{name}={_REDACTED}"
    if decode and _holds_secret(value if sep else part):
        return f"{name}={_REDACTED}" if sep else _REDACTED
    return part


#: A path parameter: ``;name=value`` up to the next ``;`` or ``/``.
_PATH_PARAM = re.compile(r";([^;/=]+)=([^;/]*)")


def _hide_path_param(match: re.Match[str]) -> str:
    return f";{match.group(1)}={_REDACTED}" if is_secret_param(match.group(1)) else match.group(0)


#: What separates parameters: ``&``, ``;``, and a ``?`` that a ``name=`` follows (a value
#: holding a plain ``?`` is still one value).
_PARAM_SEPARATOR = re.compile(r"([&;]|\?(?=[^=&;?#]+=))")


def _redact_query(query: str, decode: bool, *, every_value: bool = False) -> str:
    """A query's (or fragment's) parameters, split at ``&`` and ``;`` (both separate them),
    and at a ``?`` (``#x?sig=``, ``?next=https://h/o?X-Amz-Signature=``: a URL in a value).
    ``every_value``: each ``name=value`` loses its value, whatever the name."""
    if not query:
        return query
    pieces = _PARAM_SEPARATOR.split(query)
    hide = _hide_value if every_value else _redact_param
    return "".join(p if i % 2 else hide(p, decode) for i, p in enumerate(pieces))


def _hide_value(part: str, decode: bool) -> str:
    """One ``name=value`` of an HTTP(S) query with its value hidden, whatever its name: a
    token travels under any name (a vendor's ``?hmac=``, ``?zz9=``), which no list of
    names can know. A name alone (``?download``) is kept unless it holds a secret."""
    name, sep, value = part.partition("=")
    if sep:
        return f"{name}={_REDACTED}" if value else part
    return _redact_param(part, decode)


#: Schemes whose query is only sent to a server: every value of it is hidden. (An S3 or a
#: local path's ``?`` is part of the key or the name; a Redis URI's query holds options.)
_QUERY_SCHEMES = frozenset({"http", "https"})


def authority_end(rest: str, *, cautious: bool = False) -> int:
    """Where the authority in ``rest`` (the text after ``://``) ends.

    Normally at the first ``/``. A password with an unescaped ``/``
    (``user:pa/ss@host``) would end it early and show the password's tail as
    the "path", so when the text before that ``/`` looks like ``user:...``
    (a ``:`` not followed by a port), or holds an ``@`` followed by no
    ``host[:port]`` (``user:p@ss:w/rd@host``), and an ``@`` follows before any
    ``?`` or ``#`` (anywhere, when ``cautious``), the authority runs to that
    ``@``'s host part instead.
    """
    slash = rest.find("/")
    if slash < 0:
        return len(rest)
    head = rest[:slash]
    if "@" in head:
        # ``user:p@ss:w/rd@host``: what follows the '@' before the '/' is no host[:port],
        # so the password runs on (it ended at that '/', its tail shown as a "port").
        password_runs_on = not _is_host_port(head.rpartition("@")[2])
    else:
        _user, colon, port = head.partition(":")
        password_runs_on = bool(colon) and not port.isdigit()
    if password_runs_on:
        stop = len(rest)
        if not cautious:
            stop = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=stop)
        at = rest.rfind("@", 0, stop)
        if at >= 0:
            nxt = rest.find("/", at)
            return len(rest) if nxt < 0 else nxt
    return slash


def _is_host_port(text: str) -> bool:
    """Whether ``text`` can be an authority's ``host[:port]`` (``[v6]`` included)."""
    if text.startswith("["):
        _host, bracket, port = text.partition("]")
        return bool(bracket) and (not port or (port[0] == ":" and port[1:].isdigit()))
    _host, _colon, port = text.partition(":")
    return not port or port.isdigit()


def _redact_userinfo(scheme: str, rest: str, *, cautious: bool = False) -> str:
    """Redact the password in ``user:password@host...`` (``rest`` follows ``://``).

    Done on the raw text, before any URL parsing: a password containing
    ``?``, ``#`` or ``/`` would otherwise be mistaken for the query or path.
    A lone user name is a secret too for HTTP(S) (``https://TOKEN@host/``:
    tokens are passed that way) and Redis (``redis://secret@host``: the
    password). An S3 bucket cannot contain ``@``: one there is userinfo, and
    all of it is hidden (``s3://KEY_ID:SECRET@bucket``: the user is the key id).
    ``cautious`` (URIs being refused) treats ``user:pa/ss@`` as userinfo for
    every scheme.
    """
    if scheme in ("s3", "s3a", "file") and not cautious:
        # the key may hold ':' and '@': the host ends at '/'
        slash = rest.find("/")
        authority = rest if slash < 0 else rest[:slash]
    else:
        authority = rest[:authority_end(rest, cautious=cautious)]
    at = authority.rfind("@")
    if at < 0:
        return rest
    userinfo, tail = authority[:at], rest[at:]
    user, sep, _pw = userinfo.partition(":")
    if sep and scheme not in ("s3", "s3a"):
        return f"{user}:{_REDACTED}{tail}"
    return f"{_REDACTED}{tail}"


def redact(uri: str, *, cautious: bool = False) -> str:
    """Return ``uri`` with passwords and secret query parameters replaced by ``***`` (every
    query value of an ``http(s)://`` URL, whatever its name).

    ``cautious=True`` (for URIs being refused, which need not make sense)
    also hides what only looks like userinfo.
    """
    return _redact(uri, cautious=cautious, decode=True)


def _redact(uri: str, *, cautious: bool, decode: bool) -> str:
    if not isinstance(uri, str) or "://" not in uri:
        return uri
    scheme, _, rest = uri.partition("://")
    rest = _redact_userinfo(scheme.lower(), rest, cautious=cautious)
    # (a fragment holds parameters too: OAuth's ``#access_token=``)
    rest, hsep, fragment = rest.partition("#")
    path, qmark, query = rest.partition("?")
    if ";" in path:  # path parameters (``/app;jsessionid=...``: Java servers' sessions)
        path = _PATH_PARAM.sub(_hide_path_param, path)
    every_value = scheme.lower() in _QUERY_SCHEMES
    return (f"{scheme}://{path}{qmark}{_redact_query(query, decode, every_value=every_value)}"
            f"{hsep}{_redact_query(fragment, decode)}")


#: A URI in free text: its scheme starts at the first letter of a run of scheme characters.
#: Matched from the run's start only (the lookbehind), its leading digits/``+.-`` kept in
#: group 1: tried at every letter, a long run with no ``://`` (a hostile tensor name in a
#: message) was scanned again from each one, quadratic (minutes for 160 KB).
_URI_IN_TEXT = re.compile(r"(?<![a-zA-Z0-9+.-])([0-9+.-]*)([a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+)")


#: A ``name=value`` after ``?``, ``&``, ``;`` or ``#`` in free text (a bare ``/path?...``).
_PARAM_IN_TEXT = re.compile(
    r"([?&;#])([^=&;?#\s'\"<>]+)="
    # A ':' (or ':s') that ends the value before a space or the end is the message's
    # "URI: why", not the secret's: it stays (it was redacted with the value). The value
    # is its colons-free runs joined by colons, matched greedily: a lazy value with a
    # lookahead for the trailing colons rescanned a run of them at each step (quadratic).
    # A '?' that a ``name=`` follows starts the next parameter (``?next=https://h/o?sig=``).
    r"((?:[^&;?\s'\"#:]|\?(?![^=&;?#\s'\"]+=))*(?::+(?:[^&;?\s'\"#:]|\?(?![^=&;?#\s'\"]+=))+)*)"
)


def _param_in_text(decode: bool) -> Callable[[re.Match[str]], str]:
    def hide(match: re.Match[str]) -> str:
        lead, name, value = match.group(1, 2, 3)
        if is_secret_param(name) or (decode and _holds_secret(value)):
            return f"{lead}{name}={_REDACTED}"
        return match.group(0)

    return hide


_HIDE_PARAM = {True: _param_in_text(True), False: _param_in_text(False)}

#: The same, percent-encoded in a path (``/bkt/obj%3FX-Amz-Signature%3D...``: botocore's DEBUG
#: lines of an S3 key holding a query): an encoded ``?``, ``&``, ``;`` or ``#``, a name, an
#: encoded ``=``, the value up to the next separator, plain or encoded. A name holds no
#: encoded separator, so no two matches are tried over the same text (linear).
_ENCODED_PARAM_IN_TEXT = re.compile(
    r"(%(?:26|3[FfBb]|23))"
    r"((?:[A-Za-z0-9_.~+-]|%(?!26|3[DdFfBb]|23)[0-9A-Fa-f]{2})+)"
    r"(%3[Dd])"
    r"((?:[^&;?\s'\"#%<>]|%(?!26|3[FfBb]|23))*)"
)


def _hide_encoded_param(match: re.Match[str]) -> str:
    lead, name, equals = match.group(1, 2, 3)
    return f"{lead}{name}{equals}{_REDACTED}" if is_secret_param(name) else match.group(0)


def _uri_in_text(decode: bool) -> Callable[[re.Match[str]], str]:
    def hide(match: re.Match[str]) -> str:
        """A URI found in free text, redacted; a ':' ending it is the text's, kept."""
        lead, found = match.group(1, 2)
        uri = found.rstrip(":")
        return lead + _redact(uri, cautious=True, decode=decode) + found[len(uri):]

    return hide


_HIDE_URI = {True: _uri_in_text(True), False: _uri_in_text(False)}


def redact_text(text: str) -> str:
    """Redact every URI inside free text (log lines, messages), and secret
    query parameters even where they follow a bare ``/path?``."""
    return _redact_text(text, decode=True)


def _redact_text(text: str, *, decode: bool) -> str:
    text = _URI_IN_TEXT.sub(_HIDE_URI[decode], text)
    text = _PARAM_IN_TEXT.sub(_HIDE_PARAM[decode], text)
    return _ENCODED_PARAM_IN_TEXT.sub(_hide_encoded_param, text) if "%" in text else text
