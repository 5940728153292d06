"""URI parsing and redaction: the one place that understands URI shapes.

Accepted forms::

    /abs/path, rel/path, file:///abs/path        local disk
    http://host[:port]/path, https://...          HTTP(S)
    s3://bucket/key                               S3 (and S3-compatible)
    redis[s]://[user[:password]@]host[:port]/key[?db=N]
    any other fsspec protocol (gs://, az://, ...) generic fsspec adapter

Secrets (userinfo passwords, tokens and presigned query parameters) are
replaced by ``***`` in :meth:`ParsedURI.redacted`, which every repr, log line
and error message uses (:mod:`tensorstream.uri_redaction`; :func:`redact` and
:func:`redact_text` are named here too).
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse
from typing import Any

from .errors import InvalidURIError
from .uri_redaction import SECRET_QUERY_PARAMS, authority_end, redact, redact_text

__all__ = ["ParsedURI", "SECRET_QUERY_PARAMS", "check_file_destination", "is_utf8", "parse_uri",
           "redact", "redact_text", "redis_key_path", "windows_path_hint"]

ACCEPTED_FORMS = (
    "a local path or file:///path, http(s)://host/path, s3://bucket/key, "
    "redis[s]://[user[:password]@]host[:port]/key[?db=N], or another fsspec protocol"
)

_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


@dataclasses.dataclass(frozen=True)
class ParsedURI:
    """A parsed storage URI.

    ``path`` is what the provider addresses objects by: an absolute
    filesystem path (local), ``/path?query`` (HTTP), ``bucket/key`` (S3),
    the key (Redis), or the fsspec path. Credentials in the URI are kept
    out of ``repr``.
    """

    scheme: str
    netloc: str = dataclasses.field(repr=False)
    path: str = dataclasses.field(repr=False)
    username: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)
    host: str | None = dataclasses.field(default=None, repr=False)
    port: int | None = dataclasses.field(default=None, repr=False)
    query: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    raw: str = dataclasses.field(default="", repr=False)

    def __repr__(self) -> str:
        return f"ParsedURI({self.redacted()!r})"

    def __str__(self) -> str:
        return self.redacted()

    def __reduce__(self) -> Any:
        # Secrets never leave the process in a pickle; nor does a silently changed URI
        # (its redacted form names another object: ``?v=***``), so one holding any is refused.
        shown = self.redacted()
        if shown != self.raw or self.password is not None:
            raise TypeError(f"refusing to pickle ParsedURI({shown!r}): it holds values kept "
                            "out of every repr (user info, query values); pass the URI "
                            "string to the other process and parse it there")
        # Its fields as they are: parsing ``raw`` again in the other process resolved a
        # relative path (or ``~``) against that process's directory (or home): another file.
        return (ParsedURI, (self.scheme, self.netloc, self.path, self.username, self.password,
                            self.host, self.port, dict(self.query), self.raw))

    def __copy__(self) -> ParsedURI:
        # A copy stays in the process (copy.copy would go through __reduce__, refused above).
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ParsedURI:
        return dataclasses.replace(self, query=dict(self.query))

    @property
    def bucket(self) -> str:
        """S3 bucket (first path segment)."""
        return self.path.split("/", 1)[0]

    @property
    def key(self) -> str:
        """S3 key (everything after the bucket), or the Redis key."""
        if self.scheme == "s3":
            return self.path.split("/", 1)[1] if "/" in self.path else ""
        return self.path

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def redacted(self) -> str:
        """The URI with every secret replaced by ``***``."""
        return redact(self.raw)

    def with_path(self, path: str) -> str:
        """A URI string for another object at the same location (secrets kept)."""
        if self.scheme == "file":
            return path
        if self.scheme in ("http", "https"):
            return f"{self.scheme}://{self.netloc}{path}"
        if self.scheme == "s3":
            return f"s3://{path}"
        if self.scheme in ("redis", "rediss"):
            # The user info as given (netloc holds none: a checkpoint's shards were opened
            # without the password), and the key escaped as parse_uri unescapes it (a
            # prefix given as c%23k or c%252Fk became c#k, refused, or c/k: another key).
            netloc = urllib.parse.urlsplit(self.raw).netloc if self.raw else self.netloc
            q = f"?{urllib.parse.urlencode(self.query)}" if self.query else ""
            # A key that is not UTF-8 (listed as surrogates) is escaped byte by byte,
            # as parse_uri unescapes it: it named no URI and failed the whole copy.
            key = urllib.parse.quote(path.encode("utf-8", "surrogateescape"), safe="/")
            return f"{self.scheme}://{netloc}/{redis_key_path(key, db_given='db' in self.query)}{q}"
        return f"{self.scheme}://{path}"


#: A path redis-py's ``Redis.from_url`` (and ``redis-cli -u``) reads as the database number.
_DATABASE_PATH = re.compile(r"/(\d+)/?")


def redis_key_path(key: str, *, db_given: bool) -> str:
    """A Redis URI's path for the (escaped) ``key``: a key of digits alone (``0``,
    ``12/``) without ``?db=`` is spelled ``%30``, ``%312/``, the key and not the
    database number redis-py reads there (which :func:`parse_uri` refuses)."""
    if not db_given and _DATABASE_PATH.fullmatch("/" + key):
        return f"%3{key[0]}{key[1:]}"
    return key


def _refuse_database_path(path: str, query: dict[str, str], uri: str) -> None:
    """``redis://host:6379/0``: redis-py and redis-cli mean database 0, tensorstream
    read the key ``0`` (of database 0: a load or copy "into database 2" used key ``2``
    of database 0). Refused unless ``?db=`` says which database the key is in."""
    m = _DATABASE_PATH.fullmatch(path)
    if m is None or "db" in query:
        return
    n = m.group(1)
    base = redact(uri).split("?", 1)[0].rstrip("/").rsplit("/", 1)[0]
    # the URI's other query options (cluster=) kept: the spellings are copied as they are
    more = "".join(f"&{k}={v}" for k, v in query.items())
    raise InvalidURIError(
        f"{redact(uri)!r}: the path /{n} is the database number for redis-py's from_url and "
        f"redis-cli -u, but the key for tensorstream, which takes the database as ?db=; "
        f"write {base}/KEY?db={n}{more} (or {base}/?db={n}{more} for the whole database) for "
        f"database {n}, or {base}/{n}?db=0{more} (or /%3{n[0]}{n[1:]}) for the key {n!r}")


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: a lone surrogate (a file name in another
    encoding, ``"\\ud800"`` in JSON) names no S3 key, URL or safetensors entry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refused(uri: str) -> str:
    """How a URI being refused is shown: cautiously redacted."""
    return redact(uri, cautious=True)


_REDIS_QUERY_OPTIONS = frozenset({"db", "cluster"})
#: Characters S3 tools never accept in a bucket name; anything else after the
#: bucket (``?``, ``#``, ``%``...) is part of the key, as for ``aws s3`` and s5cmd.
_BAD_BUCKET = re.compile(r"[@:?#%/\\\s\x00-\x1f\x7f]")


#: ``C:\\x``, ``C:/x`` (as a path component, after ``abspath``) or ``\\\\server\\share``.
_WINDOWS_PATH = re.compile(r"(?:^|/)(?:[A-Za-z]:(?:[\\/]|$)|\\\\[^\\/])")


def windows_path_hint(path: str) -> str:
    """What to add to "no such file" for a local path written as Windows writes one, else
    ``""``: here ``C:\\models\\m.tensors`` is a file of that name in the current directory
    (a drive letter and ``\\`` separators mean nothing on Linux), which the bare error,
    naming ``/home/me/C:\\models\\m.tensors``, leaves the user to work out."""
    if not _WINDOWS_PATH.search(path):
        return ""
    return (" (that looks like a Windows path: here a drive letter and '\\' are part of a "
            "file name in the current directory; give the path as this machine names it, "
            "with '/', e.g. /mnt/c/models/... under WSL)")


def _parse_s3(uri: str, rest: str) -> ParsedURI:
    """``s3://bucket/key``: everything after the bucket is the key, verbatim.

    No URL parsing: ``s3://b/q?v=2`` and ``s3://b/q#v=2`` name the keys
    ``q?v=2`` and ``q#v=2`` (what ``aws s3`` and s5cmd do), never ``q``, and
    ``%`` is not decoded; ``s3://b//x`` is the key ``/x``.
    """
    bucket, _, key = rest.partition("/")
    if not bucket or _BAD_BUCKET.search(bucket):
        raise InvalidURIError(f"S3 URIs are s3://bucket/key, got {_refused(uri)!r}")
    return ParsedURI(scheme="s3", netloc=bucket, path=f"{bucket}/{key}" if key else bucket,
                     host=bucket, raw=uri)


def _parse_port(parts: urllib.parse.SplitResult, raw: str) -> int | None:
    try:
        return parts.port
    except ValueError as exc:
        raise InvalidURIError(f"invalid port in {_refused(raw)!r}; expected {ACCEPTED_FORMS}") from exc


def check_file_destination(parsed: ParsedURI) -> None:
    """Refuse a local destination given as a directory (``dir/``, ``dir/.``): its
    path is made absolute, which drops the slash, and a file was written under
    the directory's name; ``builtins.open`` raises ``IsADirectoryError`` there.
    And a remote one given as a folder (``s3://b/dir/``, ``redis://host/``): an
    object was written under the key ``dir/`` (which listings and ``cp -r`` take
    for a folder), or under the empty Redis key."""
    if parsed.is_local and parsed.raw and os.path.basename(parsed.raw) in ("", ".", ".."):
        raise InvalidURIError(f"{parsed.redacted()!r} names a directory, not a file to write: "
                              "give the file's name")
    if (not parsed.is_local and parsed.scheme not in ("http", "https")
            and (not parsed.path or parsed.path.endswith("/"))):
        raise InvalidURIError(f"{parsed.redacted()!r} names a folder, not an object to write: "
                              "give the object's name")


#: An S3 URI as far as its key: what follows is the key, whatever it ends with.
_S3_KEY = re.compile(r"s3a?://[^/\s]+/", re.IGNORECASE)


def parse_uri(uri: str | os.PathLike[str] | ParsedURI) -> ParsedURI:
    """Parse a storage URI or local path.

    >>> parse_uri("s3://bucket/model.tensors").key
    'model.tensors'
    >>> parse_uri("redis://:pw@localhost:6379/model?db=2")
    ParsedURI('redis://:***@localhost:6379/model?db=2')
    """
    if isinstance(uri, ParsedURI):
        return uri
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str):
        raise InvalidURIError(f"expected a URI string or path, got {type(uri).__name__}")
    # An S3 key may end in whitespace, and S3 decodes no %20: that is its only spelling.
    key_end = _S3_KEY.match(uri) is not None
    if uri and uri.strip() and uri.strip() != uri and "\x00" not in uri and not key_end:
        # Refused (a pasted URI's stray space); a file whose name has one is said how to name.
        raise InvalidURIError(
            f"URI {_refused(uri)!r} starts or ends with whitespace; a local file whose name "
            "does is named by a file:///absolute/path URI with it percent-encoded (%20 for a "
            "space, %0A for a newline)")
    if not uri or (uri.strip() != uri and not key_end) or "\x00" in uri:
        raise InvalidURIError(f"empty or malformed URI {_refused(uri)!r}; expected {ACCEPTED_FORMS}")
    match = _SCHEME_RE.match(uri)
    if match is None:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:/?[^/]", uri) and not re.match(r"^[a-zA-Z]:[\\/]", uri):
            scheme = uri.split(":", 1)[0].lower()
            if scheme in ("s3", "http", "https", "redis", "rediss", "file"):
                raise InvalidURIError(
                    f"malformed URI {_refused(uri)!r} (missing '//'); expected {ACCEPTED_FORMS}"
                )
        path = os.path.abspath(os.path.expanduser(uri))
        return ParsedURI(scheme="file", netloc="", path=path, raw=uri)

    scheme = match.group(1).lower()
    rest = uri[match.end():]
    if scheme in ("s3", "s3a"):
        return _parse_s3(uri, rest)
    authority = rest[:authority_end(rest, cautious=True)]
    if "@" in authority and any(c in authority.rpartition("@")[0] for c in "/?#"):
        raise InvalidURIError(
            f"malformed URI {_refused(uri)!r}: percent-encode '/', '?' and '#' in user names "
            "and passwords"
        )
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError as exc:
        raise InvalidURIError(f"malformed URI {_refused(uri)!r}; expected {ACCEPTED_FORMS}") from exc

    if scheme == "file":
        # As curl: no host, or this machine's (localhost in any case, 127.0.0.1).
        if parts.netloc.lower() not in ("", "localhost", "127.0.0.1"):
            raise InvalidURIError(
                f"file URIs must be file:///absolute/path, got {_refused(uri)!r}"
            )
        if parts.query or parts.fragment or "?" in uri or "#" in uri:
            # file:///a?b would otherwise read /a: refuse rather than name another file.
            raise InvalidURIError(
                f"file URIs take no query or fragment, got {_refused(uri)!r}; percent-encode "
                "'?' (%3F) and '#' (%23) in file names, or pass the plain path"
            )
        # %XX are bytes of the name: %FF is the byte 0xFF (surrogate-escaped, as
        # os.fsdecode has it), not U+FFFD, which named another file.
        path = urllib.parse.unquote(parts.path, errors="surrogateescape")
        if not path:
            raise InvalidURIError(f"file URI without a path: {_refused(uri)!r}")
        if "\x00" in path:  # no file name holds one: a bare "embedded null byte" later
            raise InvalidURIError(f"file URI with %00 (a NUL byte) in its path: {_refused(uri)!r}")
        return ParsedURI(scheme="file", netloc="", path=os.path.abspath(path), raw=uri)

    if scheme in ("http", "https"):
        if not parts.hostname:
            raise InvalidURIError(f"HTTP URI without a host: {_refused(uri)!r}; expected {ACCEPTED_FORMS}")
        port = _parse_port(parts, uri)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return ParsedURI(
            scheme=scheme,
            netloc=parts.netloc.rpartition("@")[2],
            path=path,
            username=urllib.parse.unquote(parts.username) if parts.username else None,
            password=urllib.parse.unquote(parts.password) if parts.password is not None else None,
            host=parts.hostname,
            port=port,
            raw=uri,
        )

    if scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise InvalidURIError(
                f"Redis URIs are redis[s]://[user[:password]@]host[:port]/key[?db=N], got {_refused(uri)!r}"
            )
        port = _parse_port(parts, uri)
        if parts.fragment or "#" in uri:
            raise InvalidURIError(
                f"Redis URIs take no fragment ('#'), got {_refused(uri)!r}; percent-encode '#' "
                "(%23) in keys"
            )
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = dict(pairs)
        if len(query) != len(pairs):  # ?db=1&db=2: which one was meant cannot be told
            raise InvalidURIError(
                f"Redis URI gives a query option twice: {_refused(uri)!r}")
        unknown = sorted(set(query) - _REDIS_QUERY_OPTIONS)
        if unknown or ("?" in uri and not parts.query):
            # redis://host/q?v=2 must not quietly read 'q': the query is for options only.
            raise InvalidURIError(
                f"Redis URIs take only {', '.join(sorted(_REDIS_QUERY_OPTIONS))} in the query, "
                f"got {_refused(uri)!r}; percent-encode '?' (%3F) in keys"
            )
        if "db" in query and not query["db"].isdigit():
            raise InvalidURIError(f"Redis db must be a number, got {_refused(uri)!r}")
        _refuse_database_path(parts.path, query, uri)
        username = urllib.parse.unquote(parts.username) if parts.username else None
        password = urllib.parse.unquote(parts.password) if parts.password is not None else None
        if username is not None and password is None:
            # redis://secret@host: the lone userinfo is a password (redis-cli's convention)
            username, password = None, username
        return ParsedURI(
            scheme=scheme,
            netloc=parts.netloc.rpartition("@")[2],
            # %FF names the byte 0xFF (Redis keys are bytes), not U+FFFD: another key.
            path=urllib.parse.unquote(parts.path.lstrip("/"), errors="surrogateescape"),
            username=username or None,
            password=password or None,
            host=parts.hostname,
            port=port,
            query=query,
            raw=uri,
        )

    # Anything else: let the generic fsspec adapter decide whether it knows it.
    return ParsedURI(scheme=scheme, netloc=parts.netloc, path=uri.split("://", 1)[1], raw=uri)
