"""Wildcard sources (s5cmd's ``*`` and ``?``): the matcher and how a URI splits."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorstream.copy.wildcards import match, wildcard
from tensorstream.errors import InvalidURIError
from tensorstream.uri import parse_uri


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                              for c in pattern), re.DOTALL)


@given(st.text("ab*?/[", max_size=8), st.text("ab/[*?", max_size=10))
def test_match_agrees_with_the_regular_expression(pattern: str, text: str) -> None:
    assert match(pattern, text) == bool(_regex(pattern).fullmatch(text))


def test_star_crosses_slashes_and_question_mark_takes_one_character() -> None:
    assert match("llama/*.safetensors", "llama/sub/model.safetensors")
    assert match("model-0000?.bin", "model-00001.bin")
    assert not match("model-0000?.bin", "model-000010.bin")
    assert not match("model-0000?.bin", "model-0000.bin")
    assert match("a[1]*", "a[1]x") and not match("a[1]*", "a1x")  # '[' is a character
    assert match("", "") and not match("", "x") and match("*", "")


def test_a_hostile_pattern_is_not_exponential() -> None:
    t0 = time.perf_counter()
    assert not match("*a" * 40 + "b", "a" * 4000)
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize(("uri", "prefix", "base"), [
    ("s3://b/llama/*.safetensors", "b/llama/", "b/llama/"),
    ("s3://b/llama/model-0000?.safetensors", "b/llama/model-0000", "b/llama/"),
    ("s3://b/*/config.json", "b/", "b/"),
    ("s3://b/a/b*/c?/d", "b/a/b", "b/a/"),
    ("redis://localhost:6379/llama/*", "llama/", "llama/"),
    ("redis://localhost:6379/k*", "k", ""),
])
def test_a_pattern_lists_its_prefix_and_names_from_the_last_slash(uri: str, prefix: str,
                                                                  base: str) -> None:
    w = wildcard(parse_uri(uri))
    assert w is not None and (w.prefix, w.base) == (prefix, base)


@pytest.mark.parametrize("uri", ["s3://b/llama/model.bin", "/tmp/a*b", "/tmp/a?b",
                                 "https://host/a/*.bin", "http://host/a?x=1"])
def test_local_paths_http_and_plain_keys_are_not_patterns(uri: str) -> None:
    assert wildcard(parse_uri(uri)) is None


@pytest.mark.parametrize("uri", ["s3://b*/x", "s3://b*x/y", "s3://*"])
def test_a_wildcard_in_the_bucket_is_refused(uri: str) -> None:
    with pytest.raises(InvalidURIError, match="not bucket names"):
        wildcard(parse_uri(uri))
