"""Secrets out of URIs and text (``tensorstream/uri_redaction.py``): passwords, tokens and
presigned parameters never shown, in a URI, a message, a parsed URI's repr or its pickle."""

from __future__ import annotations

import copy
import pickle
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorstream import errors
from tensorstream.uri import ParsedURI, parse_uri
from tensorstream.uri_redaction import redact, redact_text, secret_query_values


def test_secrets_redacted_everywhere() -> None:
    uri = ("https://u:hunter2@h/p?X-Amz-Credential=AKIAXX&X-Amz-Signature=s1g&"
           "Signature=s2&token=t0k&ok=1")
    out = redact(uri)
    for secret in ("hunter2", "AKIAXX", "s1g", "s2", "t0k"):
        assert secret not in out
    assert "ok=***" in out and "u:***@h" in out
    assert "hunter2" not in redact_text(f"failed to GET {uri} because")


@pytest.mark.parametrize("uri", ["https://u:hunter2@h/p", "https://h/p?v=2",
                                 "https://h/p?X-Amz-Signature=hunter2", "redis://:hunter2@h:6379/k"])
def test_a_parsed_uri_holding_hidden_values_refuses_to_pickle(uri: str) -> None:
    """A pickle carried the redacted form, so the other process got another URI
    (``?v=***``: another object, or a 403) without a word; it is refused now, naming
    the URI as shown and what to pass instead, never the hidden values."""
    with pytest.raises(TypeError, match="pass the URI string") as info:
        pickle.dumps(parse_uri(uri))
    assert "hunter2" not in str(info.value) and "v=2" not in str(info.value)


def test_a_pickled_relative_path_names_the_same_file_in_another_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickle was ``parse_uri(raw)``: a relative path (or ``~``) was resolved again in the
    loading process, against its own directory (a worker started elsewhere): another file.
    A URI built by hand (``raw`` empty) could not be loaded at all."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    parsed = [parse_uri("d/x.safetensors"), parse_uri("~/m.tensors"),
              ParsedURI(scheme="s3", netloc="b", path="b/k")]
    pickled = pickle.dumps(parsed)
    monkeypatch.chdir("/")
    monkeypatch.setenv("HOME", "/nonexistent")
    again = pickle.loads(pickled)
    assert again == parsed
    assert again[0].path == str(tmp_path / "d" / "x.safetensors")


def test_a_parsed_uri_built_with_a_password_refuses_to_pickle() -> None:
    with pytest.raises(TypeError, match="pass the URI string"):
        pickle.dumps(ParsedURI(scheme="redis", netloc="h", path="k", password="hunter2"))


@pytest.mark.parametrize("uri", ["https://h/m.tensors?X-Amz-Signature=f00d&v=2",
                                 "redis://u:hunter2@h:6379/k", "https://h/p?v=2"])
def test_a_parsed_uri_holding_hidden_values_copies_in_process(uri: str) -> None:
    """``copy.copy``/``copy.deepcopy`` go through the same reduction as a pickle, so the
    refusal to pickle made them raise "refusing to pickle" too (a config or dataset
    holding a presigned URL's ParsedURI could no longer be deep-copied). A copy stays in
    the process: it is the same URI, secrets and all."""
    parsed = parse_uri(uri)
    holder = {"uri": parsed, "other": [parsed]}
    for again in (copy.copy(parsed), copy.deepcopy(parsed), copy.deepcopy(holder)["uri"]):
        assert again == parsed and again.raw == uri and again.query == parsed.query
    deep = copy.deepcopy(holder)
    assert deep["uri"] is deep["other"][0]  # (deepcopy's memo kept)


@pytest.mark.parametrize("uri", ["s3://b/k.tensors", "https://h:8443/p/m.tensors", "/tmp/x y",
                                 "redis://h:6379/k", "https://h/p?"])
def test_a_parsed_uri_with_nothing_hidden_pickles_unchanged(uri: str) -> None:
    parsed = parse_uri(uri)
    again = pickle.loads(pickle.dumps(parsed))
    assert again == parsed and again.raw == parsed.raw


@pytest.mark.parametrize("uri", ["https://h/p?zz9=CANARY&ok=", "http://u@h:1/p?a=CANARY#frag",
                                 "HTTPS://h/p?x-custom=1&hmac=CANARY;q=CANARY",
                                 "https://h/p?next=https://h2/?CANARY"])
def test_every_query_value_of_an_http_url_is_hidden_names_kept(uri: str) -> None:
    """A token under a name no list knows (``?zz9=``, ``?hmac=``) was shown; every value of
    an HTTP(S) URL's query is hidden now (its names kept: they say what was sent)."""
    for shown in (redact(uri), redact_text(f"GET {uri}: HTTP 403"), repr(parse_uri(uri))):
        assert "CANARY" not in shown, shown
    out = redact(uri)
    assert out.split("?", 1)[0] == uri.split("?", 1)[0].replace("u@", "***@")
    assert "=***" in out


def test_every_query_value_of_an_http_request_is_remembered_but_the_public_ones() -> None:
    """What an HTTP(S) request's query sends, remembered as secrets where a server echoes
    one alone: a token under any name (``?hmac=``: only named ones were), repeated names,
    ``+`` and ``%2B`` as sent and decoded; not a presigned URL's date, lifetime or
    algorithm, S3's response overrides, nor a plain word or name under a name that says no
    secret (masking them hid a content type or a file name in every later error); nothing
    of the fragment (never sent)."""
    target = ("/m?hmac=f00d+feed/cafe%2B01234==&hmac=second0123456789&t=AbCdEfGhIjKlMnOp_q"
              "&X-Amz-Expires=60"
              "&X-Amz-Date=20261207T000000Z&x-amz-algorithm=AWS4-HMAC-SHA256&response-content-type="
              "application%2Fjson&empty=&flag&file=model.safetensors&region=us-east-1"
              "&sig=short#frag=fragvalue0123456789")
    assert secret_query_values(target, every_name=True) == [
        "f00d+feed/cafe%2B01234==", "f00d+feed/cafe+01234==", "f00d feed/cafe+01234==",
        "second0123456789", "AbCdEfGhIjKlMnOp_q", "short"]
    assert secret_query_values(target) == ["short"]  # (a secret name's, whatever it is)


def test_a_file_name_or_path_is_no_token_whatever_its_letters() -> None:
    """A shard's name has digits and letters, 16+ characters (as a token): remembered, it
    was masked in every later error that named the shard (``?file=***``). A JWT, which
    holds dots too, still is one (it ends in its signature), and so is base64 or hex."""
    names = ("file=model-00001-of-00002.safetensors&p=llama-2-7b%2Fconfig.json"
             "&v=pytorch_model-00001-of-00003.bin&t=Mistral-7B-v0.1.Q4_K_M.gguf")
    assert secret_query_values(f"/m?{names}", every_name=True) == []
    jwt = ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0."
           "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
    assert secret_query_values(f"/m?{names}&a={jwt}&b=0123456789abcdef0123&c=session.AbC12dEf9",
                               every_name=True) == [jwt, "0123456789abcdef0123", "session.AbC12dEf9"]


def test_an_s3_key_or_a_redis_option_after_a_question_mark_is_kept() -> None:
    """Only HTTP(S) URLs have every query value hidden: an S3 key may hold ``?k=v`` (the
    key is all of it) and a Redis URI's query holds options (``?db=1``)."""
    assert redact("s3://b/dir/a?v=1") == "s3://b/dir/a?v=1"
    assert redact("redis://h:6379/k?db=1") == "redis://h:6379/k?db=1"


@pytest.mark.parametrize("name", ["auth", "private_token", "access_key", "secret_key",
                                  "refresh_token", "id_token", "session_token",
                                  "client_secret", "jwt", "passwd", "pwd", "Auth"])
def test_other_common_token_parameters_are_redacted(name: str) -> None:
    """``?auth=`` (Firebase), ``?private_token=`` (GitLab) and other common names for a
    token in a URL were shown as given by ``cp``'s lines and errors."""
    uri = f"https://h/p?{name}=CANARY-t0k&ok=1"
    assert "CANARY" not in redact(uri) and "ok=***" in redact(uri)
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
                                  "9" * 500_000 + "http://u:CANARY@h/k",
                                  # (short: each parameter costs a call; a shared
                                  # machine's load made 80,000 of them take 1-2 s)
                                  "p?a=%" + "25" * 250_000, "?a=%3F" * 30_000,
                                  "?a=http://x=&" * 5_000])
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


@pytest.mark.parametrize("name", ["X-Api-Key", "x-api-key", "api-key", "API_KEY", "aws_session_token",
                                  "AWS_SESSION_TOKEN", "Subscription-Key", "x-auth-token",
                                  "continuation_secret", "X%2DApi%2DKey", "X-Amz-Security-Token",
                                  "client_credentials"])
def test_parameters_named_like_a_credential_are_redacted(name: str) -> None:
    """``?X-Api-Key=``, ``?api-key=``, ``?aws_session_token=`` and other names holding a
    credential word (token, secret, signature, password, credential, api key) were shown as
    given when the name was not in the fixed list: in cp's lines, errors and reprs."""
    uri = f"https://h/p?{name}=CANARY-t0k&ok=1"
    assert "CANARY" not in redact(uri) and "ok=***" in redact(uri)
    assert "CANARY" not in redact_text(f"http stat /p?{name}=CANARY-t0k: HTTP 404")
    assert "CANARY" not in repr(parse_uri(uri))


@pytest.mark.parametrize("name", ["ok", "versionId", "partNumber", "download", "sv", "se", "sp"])
def test_ordinary_parameters_stay_shown_outside_an_http_query(name: str) -> None:
    """An HTTP(S) query loses every value (names kept); in a fragment, which is never sent,
    only secrets are hidden."""
    assert redact(f"https://h/p?{name}=v1&sig=s") == f"https://h/p?{name}=***&sig=***"
    assert redact(f"https://h/p#{name}=v1&sig=s") == f"https://h/p#{name}=v1&sig=***"


@pytest.mark.parametrize("uri", ["https://h/p#access_token=CANARY-t0k&state=ok",
                                 "https://h/p#x?sig=CANARY-t0k&state=ok",
                                 "https://h/p?state=ok&next=https://h2/o?X-Amz-Signature=CANARY-s1g",
                                 "https://h/p?state=ok&next=https://u:CANARY-pw@h2/o",
                                 "https://h/p?a=1#access_token=CANARY-t0k&state=ok",
                                 "https://h/p?a=1;sig=CANARY-t0k;state=ok",
                                 "https://h/p?a=1&SIG=CANARY-t0k;state=ok"])
def test_parameters_in_a_fragment_or_after_a_semicolon_are_redacted(uri: str) -> None:
    """A token in the fragment (OAuth's ``#access_token=``), a parameter after a ``;``
    (the other query separator) or a ``?`` in the fragment, and a URL with a secret given
    unencoded as a parameter's value were shown by ``redact`` and so by every repr."""
    for shown in (redact(uri), redact_text(f"failed {uri}: 404"), repr(parse_uri(uri))):
        assert "CANARY" not in shown and "state=" in shown


@pytest.mark.parametrize("value", [
    "https%3A%2F%2Fh2%2Fo%3FX-Amz-Signature%3DCANARY-s1g",       # a presigned URL, encoded
    "https%253A%252F%252Fh2%252Fo%253Ftoken%253DCANARY-t0k",     # encoded twice
    "https%3A%2F%2Fu%3ACANARY-pw%40h2%2Fo",                      # userinfo, encoded
])
def test_an_encoded_url_with_a_secret_inside_a_parameter_is_redacted(value: str) -> None:
    """A URL passed in a parameter (``?next=https%3A...%3FX-Amz-Signature%3D...``, a redirect
    target or a login page's) kept its secrets: they are percent-encoded there."""
    uri = f"https://h/p?next={value}&ok=1"
    for shown in (redact(uri), redact_text(f"http stat /p?next={value}&ok=1: HTTP 404"),
                  redact_text(f"failed {uri}: 404"), repr(parse_uri(uri))):
        assert "CANARY" not in shown and "ok=" in shown


def test_an_encoded_parameter_name_or_separator_is_redacted() -> None:
    """``X%2DAmz%2DSignature=`` after a bare path, and ``x-amz-signature%3D...`` (the ``=``
    encoded), were shown."""
    assert "CANARY" not in redact_text("http stat /p?X%2DAmz%2DSignature=CANARY-s1g: HTTP 403")
    assert "CANARY" not in redact("https://h/p?x-amz-signature%3DCANARY-s1g&ok=1")


@pytest.mark.parametrize("text", [
    "GET /bkt/obj%3FX-Amz-Signature%3DCANARY-s1g HTTP/1.1",        # botocore's DEBUG line
    "/bkt/obj%3fok%3D1%26x-api-key%3dCANARY-k3y: HTTP 403",
    "/k%3Fa%3D1%3Bsig%3DCANARY-s1g%26ok%3D2",
    "/k%23access_token%3DCANARY-t0k",
    "/k%3FX%252DAmz%252DSignature%3DCANARY-s1g",
])
def test_a_percent_encoded_query_in_text_is_redacted(text: str) -> None:
    """A query percent-encoded in a path (``%3F``, ``%26``, ``%3D``): botocore's DEBUG log of
    ``s3://bkt/obj?X-Amz-Signature=...`` (a presigned URL's query pasted after an S3 key)
    showed the signature."""
    shown = redact_text(text)
    assert "CANARY" not in shown
    assert "ok%3D" not in text or ("ok%3D1" in shown or "ok%3D2" in shown)


def test_a_percent_encoded_text_without_a_secret_is_left_alone() -> None:
    for text in ("/bkt/a%3Fb%3Dc%26d%3De", "%26" * 50_000 + "a", "%3Fa" * 50_000, "/x%3D%3D%3D"):
        assert redact_text(text) == text


@pytest.mark.parametrize("uri", ["https://h/app;jsessionid=CANARY-s1d/model.bin?ok=1",
                                 "https://h/a;SIG=CANARY-s1g;v=1/b?ok=1",
                                 "https://h/a;x-api-key=CANARY-k3y?ok=1",
                                 "https://h/a;PHPSESSID=CANARY-s1d?ok=1"])
def test_a_secret_parameter_in_the_path_is_redacted(uri: str) -> None:
    """A path parameter (``/app;jsessionid=<session>/model.bin``: Java servers put the session
    there) was shown by ``redact``, and so by every repr."""
    for shown in (redact(uri), redact_text(f"failed {uri}: 404"), repr(parse_uri(uri))):
        assert "CANARY" not in shown and "ok=" in shown
    assert redact("https://h/a;v=1/b;type=x") == "https://h/a;v=1/b;type=x"


def test_a_value_holding_a_plain_question_mark_is_hidden_whole() -> None:
    for uri in ("https://h/p?token=CANARY?tail-CANARY&ok=1", "https://h/p#sig=CANARY?tail-CANARY"):
        for shown in (redact(uri), redact_text(f"failed {uri}: 404")):
            assert "CANARY" not in shown
