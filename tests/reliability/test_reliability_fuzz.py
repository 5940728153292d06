"""Reliability: property tests. Random ranges x random fault schedules against a real
HTTP server (exact bytes or an exception, never anything else), and fuzzing of the
URI parser, the Content-Range parser and cp's key-to-path mapper."""

from __future__ import annotations

import os
import posixpath

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tensorstream
from tensorstream import _loop, errors
from tensorstream.copy.keys import UnsafeKeyError, plan_keys, safe_relative_key
from tensorstream.providers._http.headers import parse_content_range
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.uri import parse_uri, redact

pytestmark = [pytest.mark.usefixtures("http_reset"), pytest.mark.timeout(240)]

DATA = os.urandom(256 << 10)
KEY = "fuzz-object.bin"

faults = st.fixed_dictionaries({
    "drop_after": st.one_of(st.none(), st.integers(0, 200_000)),
    "drop_times": st.one_of(st.none(), st.integers(1, 3)),
    "status_script": st.lists(st.sampled_from([500, 503, 429, 404, 403]), max_size=3),
    "ignore_range": st.booleans(),
    "wrong_content_range": st.booleans(),
    "gzip": st.booleans(),
    "no_content_length": st.booleans(),
    "ignore_if_match": st.booleans(),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, len(DATA) - 1), length=st.integers(1, len(DATA)),
       fault=faults, parts=st.sampled_from([16 << 10, 64 << 10, 1 << 20]))
def test_random_ranges_under_random_faults_are_exact_or_raise(
        http_server: HTTPTestServer, start: int, length: int, fault: dict[str, object],
        parts: int) -> None:
    end = min(start + length, len(DATA))
    http_server.put(KEY, DATA)
    http_server.faults.reset()
    try:
        with tensorstream.open(http_server.url(KEY), retries=3, backoff_initial=0.001,
                               backoff_max=0.005, part_size=parts, concurrency=4) as f:
            for name, value in fault.items():  # faults start after open (stat) succeeded
                setattr(http_server.faults, name, value)
            f.seek(start)
            got = f.read(end - start)
    except errors.TensorstreamError:
        return  # an exception is an allowed outcome
    finally:
        http_server.faults.reset()
    assert got == DATA[start:end]
    # Only transient, bounded faults may end in success.
    assert not fault["ignore_range"] and not fault["wrong_content_range"] and not fault["gzip"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, len(DATA) - 1), length=st.integers(1, len(DATA)),
       drop_after=st.integers(1, 100_000), drop_times=st.integers(1, 2))
def test_bounded_transient_faults_always_end_in_exact_bytes(
        http_server: HTTPTestServer, start: int, length: int, drop_after: int,
        drop_times: int) -> None:
    end = min(start + length, len(DATA))
    http_server.put(KEY, DATA)
    http_server.faults.reset()

    async def read() -> bytes:
        http_server.faults.drop_after, http_server.faults.drop_times = drop_after, drop_times
        try:
            return await tensorstream.read_range(http_server.url(KEY), start, end, retries=4,
                                                 backoff_initial=0.001, backoff_max=0.005,
                                                 part_size=8 << 20)
        finally:
            http_server.faults.reset()

    assert _loop.run_sync(read()) == DATA[start:end]


# -- parsers --------------------------------------------------------------------------
_uri_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=80)
_schemes = st.sampled_from(["", "s3://", "http://", "https://", "redis://", "rediss://",
                            "file://", "gs://", "S3://"])


@settings(max_examples=500, deadline=None)
@given(scheme=_schemes, rest=_uri_text, secret=st.text(
    st.characters(codec="ascii", min_codepoint=0x21, max_codepoint=0x7e), min_size=12,
    max_size=20).filter(lambda s: "@" not in s and "/" not in s and "%" not in s))
def test_uri_parser_never_crashes_and_never_shows_a_password(scheme: str, rest: str,
                                                             secret: str) -> None:
    secret = "PW~" + secret
    assume(secret not in rest)
    for text in (scheme + rest, f"{scheme}user:{secret}@{rest}"):
        try:
            parsed = parse_uri(text)
        except errors.InvalidURIError as exc:
            assert isinstance(exc, ValueError)
            if "@" in text and "user:" in text and scheme:
                assert secret not in str(exc)
            continue
        shown = f"{parsed!r} {parsed} {parsed.redacted()}"
        if scheme and f"user:{secret}@" in text and parsed.password == secret:
            assert secret not in shown
        assert parse_uri(parsed) is parsed


#: Passwords with every character a URI treats specially (issue 15): '/', '@', ':', '%',
#: '#', '?'. Only an '@' followed later by a '/' is left out: ``user:a@b/c@host`` is
#: genuinely ``user:a`` at host ``b`` (RFC 3986 wants both escaped).
_special_secret = st.text(
    st.sampled_from("/@:%#?&=+;~!$'()*,[]") | st.characters(codec="ascii", min_codepoint=0x30,
                                                             max_codepoint=0x7a),
    min_size=8, max_size=24)


def _never_shown(text: str, secret: str) -> None:
    """``text`` parses to a URI whose repr/str/redacted form hides ``secret``, or is
    refused with an error that hides it; nothing else."""
    import urllib.parse

    hidden = {secret, urllib.parse.unquote(secret)} - {""}
    try:
        parsed = parse_uri(text)
    except errors.InvalidURIError as exc:
        assert not [h for h in hidden if h in f"{exc} {exc!r}"], (text, str(exc))
        return
    shown = f"{parsed!r} {parsed} {parsed.redacted()} {redact(text)}"
    assert not [h for h in hidden if h in shown], (text, shown)


@settings(max_examples=600, deadline=None)
@given(scheme=st.sampled_from(["http://", "https://", "redis://", "rediss://", "s3://",
                               "gs://", "file://"]),
       secret=_special_secret, tail=st.sampled_from(["", "/", "/k", "/a/b?x=1", ":6379/k",
                                                     "/k?db=2", "/k#f"]))
def test_passwords_with_uri_delimiters_never_shown(scheme: str, secret: str, tail: str) -> None:
    assume("@" not in secret or "/" not in secret.split("@", 1)[1])
    secret = "PW~" + secret
    _never_shown(f"{scheme}user:{secret}@host{tail}", secret)


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(["http://", "https://", "redis://", "rediss://"]),
       token=st.text(st.characters(codec="ascii", min_codepoint=0x21, max_codepoint=0x7e),
                     min_size=8, max_size=40).filter(lambda t: not set(t) & set("/:@?#")),
       tail=st.sampled_from(["", "/", "/model.tensors", "/k?db=1"]))
def test_a_token_given_as_the_lone_user_name_is_never_shown(scheme: str, token: str,
                                                            tail: str) -> None:
    _never_shown(f"{scheme}TK{token}@host{tail}", "TK" + token)


@settings(max_examples=500, deadline=None)
@given(key=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60))
def test_an_s3_key_is_kept_verbatim_or_the_uri_refused(key: str) -> None:
    """Names with control characters, '?', '#', '%', '//': the key is exactly what
    follows the bucket, or the URI is refused; never a shorter or decoded key."""
    text = f"s3://bucket/{key}"
    try:
        parsed = parse_uri(text)
    except errors.InvalidURIError:
        assert "\x00" in key  # (a key ending in whitespace is kept: it has no other spelling)
        return
    assert parsed.key == key and parsed.bucket == "bucket"
    assert parse_uri(parsed.with_path(parsed.path)).key == key


@settings(max_examples=300, deadline=None)
@given(rest=_uri_text)
def test_redact_is_idempotent(rest: str) -> None:
    once = redact("https://" + rest)
    assert redact(once) == once


@settings(max_examples=500, deadline=None)
@given(value=st.one_of(
    st.text(max_size=40),
    st.builds(lambda a, b, t: f"bytes {a}-{b}/{t}", st.integers(-5, 10**12),
              st.integers(-5, 10**12), st.one_of(st.integers(-5, 10**12), st.just("*"))),
))
def test_content_range_parser_accepts_only_consistent_ranges(value: str) -> None:
    cr = parse_content_range(value)
    if cr is None:
        return
    if cr.first is not None:
        assert cr.last is not None and 0 <= cr.first <= cr.last
        assert cr.total is None or cr.last < cr.total
    else:
        assert cr.last is None and cr.total is not None and cr.total >= 0


_segment = st.one_of(st.sampled_from(["..", ".", "", "a", "dst-evil", "b c", "\\", "x\x00"]),
                     st.text(max_size=6))


@settings(max_examples=500, deadline=None)
@given(segments=st.lists(_segment, min_size=1, max_size=6), lead=st.sampled_from(["", "/"]),
       trail=st.sampled_from(["", "/"]))
def test_key_mapper_never_leaves_the_destination(segments: list[str], lead: str,
                                                 trail: str) -> None:
    key = lead + "/".join(segments) + trail
    dest = "/dst"
    for filesystem in (True, False):  # a remote destination's key joins its prefix as a path
        try:
            rel = safe_relative_key(key, filesystem=filesystem)
        except UnsafeKeyError:
            continue
        target = posixpath.normpath(posixpath.join(dest, rel))
        assert target.startswith(dest + "/") and target != dest
        assert posixpath.relpath(target, dest) == rel  # nothing was normalised away


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.text(st.sampled_from("ab/."), max_size=6), max_size=8),
       order=st.randoms(use_true_random=False))
def test_key_plan_is_independent_of_listing_order(keys: list[str], order: object) -> None:
    shuffled = list(keys)
    order.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = plan_keys(keys, filesystem=True), plan_keys(shuffled, filesystem=True)
    assert (a.copy, a.refused, a.skipped) == (b.copy, b.refused, b.skipped)
    copied = {rel for _, rel in a.copy}
    for rel in copied:  # never both a file and a directory
        assert not any(other.startswith(rel + "/") for other in copied)
