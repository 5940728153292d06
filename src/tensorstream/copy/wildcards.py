"""Wildcard sources, as s5cmd has them: ``s3://bucket/llama/*.safetensors``.

``*`` matches any run of characters, ``/`` included, and ``?`` exactly one;
nothing else is special (``[`` is an ordinary character in a key). A source
whose key holds either is listed from the longest prefix before its first
wildcard, and each matching object lands under the destination by its key
relative to the last ``/`` before that wildcard, as s5cmd does:
``cp 's3://b/models/*/config.json' out/`` writes ``out/llama/config.json``.

Only sources that can be listed and whose ``?`` is not a query separator
take wildcards (S3, Redis, fsspec stores): a local path is the shell's to
expand (quoted, it is an ordinary name), and HTTP(S) has no listing. A key
that really holds ``*`` or ``?`` still matches itself.
"""

from __future__ import annotations

import dataclasses

from ..errors import InvalidURIError
from ..uri import ParsedURI, redact_text

__all__ = ["WILDCARDS", "Wildcard", "wildcard"]

#: The characters that make a source a pattern.
WILDCARDS = "*?"
#: Schemes whose paths are never patterns.
_LITERAL_SCHEMES = frozenset({"file", "http", "https"})
#: Schemes whose path starts with a bucket name (wildcards match keys only).
_BUCKETED = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs"})


@dataclasses.dataclass(frozen=True)
class Wildcard:
    """A source pattern: list :attr:`prefix`, keep the paths :meth:`relative`
    names (relative to :attr:`base`, empty or ending in ``/``)."""

    pattern: str
    prefix: str
    base: str

    def relative(self, path: str) -> str | None:
        """``path``'s name relative to :attr:`base` if it matches, else None (a
        match starts with :attr:`base`: the pattern does, up to its first wildcard)."""
        return path[len(self.base):] if match(self.pattern, path) else None

    def names(self, rel: str) -> bool:
        """Whether the pattern matches the path named ``rel`` from :attr:`base`."""
        return match(self.pattern, self.base + rel)


def wildcard(uri: ParsedURI) -> Wildcard | None:
    """The pattern ``uri`` names, or None when it names a path as it is."""
    path = uri.path
    if uri.scheme in _LITERAL_SCHEMES or not any(c in path for c in WILDCARDS):
        return None
    first = min(i for i in (path.find(c) for c in WILDCARDS) if i >= 0)
    if uri.scheme in _BUCKETED and "/" not in path[:first]:
        bucket = redact_text(path.split("/", 1)[0])
        raise InvalidURIError(f"wildcards match keys, not bucket names ({bucket!r}): name the "
                              "bucket, then the pattern (s3://bucket/dir/*)")
    base = path[: path.rfind("/", 0, first) + 1]
    return Wildcard(pattern=path, prefix=path[:first], base=base)


def match(pattern: str, text: str) -> bool:
    """``*``/``?`` matching of all of ``text``, in O(len(pattern) x len(text))
    at worst (a regular expression of many ``*`` backtracks exponentially on
    a hostile key): on a mismatch, only the last ``*`` takes one more character."""
    p = t = 0
    star = -1  # the pattern position after the last '*' seen
    resume = 0  # where in text that '*' stopped matching
    while t < len(text):
        if p < len(pattern) and pattern[p] == "*":
            star, resume = p + 1, t
            p += 1
        elif p < len(pattern) and (pattern[p] == "?" or pattern[p] == text[t]):
            p += 1
            t += 1
        elif star >= 0:
            resume += 1
            p, t = star, resume
        else:
            return False
    return all(c == "*" for c in pattern[p:])
