"""Secrets out of URIs and text (``tensorstream/uri_redaction.py``): passwords, tokens and
presigned parameters never shown, in a URI, a message, a parsed URI's repr or its pickle."""

from __future__ import annotations

import pickle
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorstream import errors
from tensorstream.uri import parse_uri
from tensorstream.uri_redaction import redact, redact_text


def test_secrets_redacted_everywhere() -> None:
    uri = ("https://u:hunter2@h/p?X-Amz-Credential=AKIAXX&X-Amz-Signature=s1g&"
           "Signature=s2&token=t0k&ok=1")
    out = redact(uri)
    for secret in ("hunter2", "AKIAXX", "s1g", "s2", "t0k"):
        assert secret not in out
    assert "ok=1" in out and "u:***@h" in out
    assert "hunter2" not in redact_text(f"failed to GET {uri} because")
    # pickles carry only the redacted form
    assert b"hunter2" not in pickle.dumps(parse_uri(uri))


@pytest.mark.parametrize("name", ["auth", "private_token", "access_key", "secret_key",
                                  "refresh_token", "id_token", "session_token",
                                  "client_secret", "jwt", "passwd", "pwd", "Auth"])
def test_other_common_token_parameters_are_redacted(name: str) -> None:
    """``?auth=`` (Firebase), ``?private_token=`` (GitLab) and other common names for a
    token in a URL were shown as given by ``cp``'s lines and errors."""
    uri = f"https://h/p?{name}=CANARY-t0k&ok=1"
    assert "CANARY" not in redact(uri) and "ok=1" in redact(uri)
    assert "CANARY" not in redact_text(f"http stat /p?{name}=CANARY-t0k: HTTP 404")
    assert "CANARY" not in repr(parse_uri(uri))


def test_redacting_a_message_keeps_its_separators() -> None:
    """The ':' after a URI in ``URI: why`` was taken for the end of the secret and
    redacted with it (``...?X-Amz-Signature=*** http stat /k?X-Amz-Signature=*** HTTP 403``)."""
    text = "http://h/k?X-Amz-Signature=s1g: http stat /k?sig=s2g: HTTP 403: refused"
    assert redact_text(text) == ("http://h/k?X-Amz-Signature=***: http stat /k?sig=***: "
                                 "HTTP 403: refused")
    assert redact_text("http://h/k?token=a:b: x") == "http://h/k?token=***: x"
    assert redact_text("see /k?token=a:b:c here") == "see /k?token=*** here"


@pytest.mark.parametrize("text", ["x" * 500_000, "a1" * 250_000, "p?token=" + ":" * 500_000 + "x",
                                  "9" * 500_000 + "http://u:CANARY@h/k"])
def test_redacting_a_long_message_takes_linear_time(text: str) -> None:
    """A hostile tensor name or dtype in an error (megabytes of it: a safetensors header may
    hold 100 MB) went through redact_text quadratically: minutes for 160 KB, so ``tensorstream
    inspect`` of such a file never printed its error. Now half a megabyte takes milliseconds."""
    started = time.monotonic()
    out = redact_text(text)
    assert time.monotonic() - started < 2.0
    assert "CANARY" not in out and len(out) <= len(text)
    # what the scheme runs into is kept, as before
    assert redact_text("a1.-http://u:pw@h/k?sig=s: x") == "a1.-http://u:***@h/k?sig=***: x"
    assert redact_text("(s3://AKIA:pw@b/k)") == "(s3://***@b/k)"


@pytest.mark.parametrize("uri", ["s3://AKIACANARYID:s3cr3t@bkt/k", "s3a://AKIACANARYID:s3cr3t@b/k",
                                 "s3://AKIACANARYID@bkt/k"])
def test_s3_userinfo_is_hidden_whole(uri: str) -> None:
    """For S3 the user in userinfo is the access key id: hidden with the secret (the
    CLI's refusal of such a URI printed 's3://AKIA...:***@bkt/k')."""
    for shown in (redact(uri), redact_text(f"got {uri!r} here")):
        assert "AKIACANARYID" not in shown and "s3cr3t" not in shown
        assert "***@b" in shown
    with pytest.raises(errors.InvalidURIError) as info:
        parse_uri(uri)
    assert "AKIACANARYID" not in str(info.value) and "s3cr3t" not in str(info.value)


@given(
    st.sampled_from(["http", "https", "redis", "rediss"]),
    st.text(alphabet=st.characters(min_codepoint=0x30, max_codepoint=0x7A), min_size=4, max_size=20),
)
def test_password_never_survives_redaction(scheme: str, secret: str) -> None:
    uri = f"{scheme}://user:{secret}@example.com/key"
    assert f":{secret}@" not in redact(uri)
    try:
        parsed = parse_uri(uri)
    except errors.InvalidURIError:
        return
    assert f":{secret}@" not in repr(parsed)
