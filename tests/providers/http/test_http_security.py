"""HTTP(S) credentials, TLS and redirects: secrets go only where they belong."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import subprocess
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from fixtures_http import HTTP_TEST_TOKEN
from tensorstream import errors
from tensorstream.providers._http.headers import is_metadata_address
from tensorstream.providers.http.config import resolve_http_credentials
from tensorstream.providers.http.provider import InsecureTLSWarning
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom(300_000)


def _put(server: HTTPTestServer, data: bytes = DATA) -> tuple[str, str]:
    key = f"sec-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, data)
    return key, server.url(key)


# -- bearer token / basic auth ---------------------------------------------------
async def test_bearer_token_option_is_sent(http_token_server: HTTPTestServer) -> None:
    key, url = _put(http_token_server)
    assert await tensorstream.read_range(url, 0, 100, token=HTTP_TEST_TOKEN) == DATA[:100]
    assert http_token_server.requests_for(key)[-1].headers["Authorization"] == (
        f"Bearer {HTTP_TEST_TOKEN}")


async def test_token_from_environment(http_token_server: HTTPTestServer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = _put(http_token_server)
    with pytest.raises(PermissionError):
        await tensorstream.stat(url)
    monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN", HTTP_TEST_TOKEN)
    assert (await tensorstream.stat(url)).size == len(DATA)


async def test_wrong_token_error_never_shows_a_token(
        http_token_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    _, url = _put(http_token_server)
    wrong = "wrong-canary-" + uuid.uuid4().hex
    caplog.set_level(logging.DEBUG)
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(url, 0, 10, token=wrong)
    text = f"{info.value} {info.value!r} {caplog.text}"
    assert "401" in str(info.value)
    assert wrong not in text and HTTP_TEST_TOKEN not in text


async def test_a_refusal_says_which_credentials_were_sent_or_where_it_looked(
        http_token_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = _put(http_token_server)
    for sequential in (False, True):
        with pytest.raises(errors.PermissionDeniedError) as info:
            tensorstream.open(url, sequential=sequential)
        message = str(info.value)
        assert "401" in message and "sent no Authorization" in message
        for place in ("option token", "URI userinfo", "TENSORSTREAM_HTTP_TOKEN", ".netrc"):
            assert place in message
    wrong = "wrong-canary-" + uuid.uuid4().hex
    monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN", wrong)
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(url, 0, 10)
    assert "sent the Authorization from env TENSORSTREAM_HTTP_TOKEN" in str(info.value)
    assert wrong not in f"{info.value} {info.value!r}"



CANARY = "canary-unsendable-4e2a"


@pytest.mark.parametrize("how", ["env newline", "token beyond Latin-1", "header beyond Latin-1",
                                 "header name with its value", "header name ending a line"])
async def test_a_credential_http_cannot_send_is_refused_unshown(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # Were a bare ValueError("Invalid header value b'Bearer <token>\\n'") for the
    # variable (the token option was checked, the variable not), a UnicodeEncodeError
    # holding 'Bearer <token>' whole, and "invalid header name 'X-Api-Key: <key>'".
    _, url = _put(http_server)
    options: dict[str, object] = {}
    if how == "env newline":
        monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN", CANARY + "\n")
    elif how == "token beyond Latin-1":
        options["token"] = CANARY + "\u2603"
    elif how == "header beyond Latin-1":
        options["headers"] = {"X-Api-Key": CANARY + "\u2603"}
    elif how == "header name ending a line":  # ('$' matched before the line break)
        options["headers"] = {"X-Api-Key\n": CANARY}
    else:
        options["headers"] = {f"X-Api-Key: {CANARY}": "x"}
    with pytest.raises(errors.ConfigurationError) as info:
        await tensorstream.stat(url, retries=1, **options)
    said = "".join(traceback.format_exception(info.value)) + repr(info.value.args)
    assert CANARY not in said
    assert ("TENSORSTREAM_HTTP_TOKEN" in said if how == "env newline" else True)


def _basic(login: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


def test_netrc_gives_basic_auth_to_its_host_only(
        http_server: HTTPTestServer, isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, url = _put(http_server)
    host = url.split("://", 1)[1].split(":", 1)[0]
    netrc = isolated_env / "home" / ".netrc"
    netrc.write_text(f"machine {host} login alice password netrc-canary\n"
                     "machine other.example login bob password other-pw\n")
    with tensorstream.open(url) as f:
        assert f.read(10) == DATA[:10]
    assert http_server.requests_for(key)[-1].headers["Authorization"] == _basic(
        "alice", "netrc-canary")
    report = str(tensorstream.describe_credentials(url))
    assert f"{netrc} [machine {host}]" in report and "netrc-canary" not in report
    # An explicit token wins; another host's entry is never sent; $NETRC names the file.
    with tensorstream.open(url, token="tok") as f:
        f.read(10)
    assert http_server.requests_for(key)[-1].headers["Authorization"] == "Bearer tok"
    other = isolated_env / "other-netrc"
    other.write_text("machine other.example login bob password other-pw\n")
    monkeypatch.setenv("NETRC", str(other))
    with tensorstream.open(url) as f:
        f.read(10)
    assert "Authorization" not in http_server.requests_for(key)[-1].headers


@pytest.mark.parametrize("text", [
    "machine {host} login alice password netrc-canary trailing-junk\n",
    "machine {host} login alice password pw\nnetrc-canary\n",
    "macdefine netrc-canary\n",
])
def test_a_broken_netrc_is_a_configuration_error_that_quotes_nothing(
        http_server: HTTPTestServer, isolated_env: Path, text: str) -> None:
    _, url = _put(http_server)
    host = url.split("://", 1)[1].split(":", 1)[0]
    (isolated_env / "home" / ".netrc").write_text(text.format(host=host))
    with pytest.raises(errors.ConfigurationError, match="netrc") as info:
        tensorstream.open(url)
    assert "netrc-canary" not in f"{info.value} {info.value!r} {info.value.__cause__!r}"
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_provider_and_credentials_never_reveal_secrets(
        http_token_server: HTTPTestServer) -> None:
    _, url = _put(http_token_server)
    provider = tensorstream.get_provider(url, token=HTTP_TEST_TOKEN,
                                         headers={"X-Api-Key": "hdr-canary"})
    assert HTTP_TEST_TOKEN not in repr(provider) and "hdr-canary" not in repr(provider)
    assert "X-Api-Key" in repr(provider.inner)
    with pytest.raises(TypeError):
        pickle.dumps(provider.inner)
    creds = resolve_http_credentials(token=HTTP_TEST_TOKEN, env={})
    with pytest.raises(TypeError):
        pickle.dumps(creds)
    assert creds.authorization is not None and creds.authorization.source == "argument token"


def test_credential_precedence(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-bundle.pem")
    uri = tensorstream.parse_uri("https://user:pw@example.com/x")
    env = {"TENSORSTREAM_HTTP_TOKEN": "from-env", "SSL_CERT_FILE": __file__,
           "REQUESTS_CA_BUNDLE": missing}
    c = resolve_http_credentials(uri, headers={"Authorization": "Custom x"}, token="t", env=env)
    assert (c.authorization and c.authorization.source) == "argument headers"
    c = resolve_http_credentials(uri, token="t", env=env)
    assert c.auth_headers()["Authorization"] == "Bearer t"
    c = resolve_http_credentials(uri, env=env)
    assert c.auth_headers()["Authorization"] == "Basic dXNlcjpwdw=="  # user:pw
    c = resolve_http_credentials(None, env=env)
    assert c.auth_headers()["Authorization"] == "Bearer from-env"
    assert c.ca_bundle is not None and c.ca_bundle.source == "env SSL_CERT_FILE"
    with pytest.raises(errors.ConfigurationError, match="REQUESTS_CA_BUNDLE"):
        resolve_http_credentials(None, env={"REQUESTS_CA_BUNDLE": missing})


async def test_basic_auth_from_uri_userinfo() -> None:
    with HTTPTestServer(basic_auth=("alice", "pw-canary")) as server:
        key, _ = _put(server)
        url = f"http://alice:pw-canary@127.0.0.1:{server.port}/{key}"
        assert await tensorstream.read_range(url, 0, 10) == DATA[:10]
        bad = f"http://alice:nope-canary@127.0.0.1:{server.port}/{key}"
        with pytest.raises(PermissionError) as info:
            await tensorstream.read_range(bad, 0, 10)
        assert "nope-canary" not in f"{info.value} {info.value!r}"


async def test_presigned_query_survives_exactly_and_is_redacted(
        http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    query = "?X-Amz-Signature=sig%2Fcanary&X-Amz-Credential=AKIA%2Fx&a=1"
    assert await tensorstream.read_range(url + query, 0, 10) == DATA[:10]
    assert http_server.requests_for(key)[-1].path.endswith(query)  # not re-encoded
    with pytest.raises(FileNotFoundError) as info:
        await tensorstream.read_range(http_server.url("missing") + query, 0, 10)
    assert "canary" not in f"{info.value} {info.value!r}"


# -- TLS -----------------------------------------------------------------------------------
async def test_untrusted_certificate_is_refused_at_once(https_server: HTTPTestServer) -> None:
    _, url = _put(https_server)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=r"(?i)certificate"):
        await tensorstream.stat(url, backoff_initial=0.5)
    assert time.monotonic() - t0 < 0.5  # permanent: not retried


async def test_ca_bundle_option_and_env(https_server: HTTPTestServer,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = _put(https_server)
    got = await tensorstream.read_range(url, 5, 50, ca_bundle=https_server.ca_bundle_path)
    assert got == DATA[5:50]
    monkeypatch.setenv("SSL_CERT_FILE", str(https_server.ca_bundle_path))
    assert (await tensorstream.stat(url)).size == len(DATA)


async def test_ca_bundle_from_curl_ca_bundle(https_server: HTTPTestServer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # requests and curl users have CURL_CA_BUNDLE set for their private CA: it was
    # ignored, and the read failed on an untrusted certificate.
    _, url = _put(https_server)
    monkeypatch.setenv("CURL_CA_BUNDLE", str(https_server.ca_bundle_path))
    assert (await tensorstream.stat(url)).size == len(DATA)
    env = {"REQUESTS_CA_BUNDLE": __file__, "CURL_CA_BUNDLE": "/no/such/file"}
    got = resolve_http_credentials(None, env=env).ca_bundle  # requests' order
    assert got is not None and got.source == "env REQUESTS_CA_BUNDLE"


async def test_insecure_works_and_warns(https_server: HTTPTestServer,
                                        caplog: pytest.LogCaptureFixture) -> None:
    _, url = _put(https_server)
    with pytest.warns(InsecureTLSWarning, match="insecure=True"):
        assert await tensorstream.read_range(url, 0, 10, insecure=True) == DATA[:10]
    assert "verification is disabled" in caplog.text


@pytest.fixture(scope="module")
def mtls_server() -> Iterator[HTTPTestServer]:
    with HTTPTestServer(require_client_cert=True) as server:
        yield server


async def test_client_certificate(mtls_server: HTTPTestServer) -> None:
    _, url = _put(mtls_server)
    with pytest.raises(ConnectionError):
        await tensorstream.stat(url, ca_bundle=mtls_server.ca_bundle_path, retries=1)
    assert (await tensorstream.stat(url, **mtls_server.options)).size == len(DATA)


def test_a_client_certificate_that_cannot_be_loaded_is_a_clear_error(
        mtls_server: HTTPTestServer, tmp_path: Path) -> None:
    # Was "TLS failed (SSLError: [SSL] PEM lib ...); for a private CA pass ca_bundle=",
    # naming no file; an encrypted key made OpenSSL prompt on the terminal.
    _, url = _put(mtls_server)
    cert, key = mtls_server.client_cert_path, mtls_server.client_key_path
    assert cert is not None and key is not None
    encrypted = tmp_path / "encrypted.key"
    from cryptography.hazmat.primitives import serialization

    pem = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    encrypted.write_bytes(pem.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass-phrase")))
    ca = mtls_server.ca_bundle_path
    for opts, named in [({"client_cert": cert}, "client_key="),  # the key is in another file
                        ({"client_cert": cert, "client_key": str(encrypted)}, "encrypted"),
                        ({"client_cert": key, "client_key": key}, str(key))]:
        t0 = time.monotonic()
        with pytest.raises(errors.ConfigurationError, match="client certificate") as info:
            tensorstream.open(url, ca_bundle=ca, retries=3, **opts).close()
        assert named in str(info.value) and time.monotonic() - t0 < 2


def test_a_ca_bundle_that_is_not_pem_names_the_file(https_server: HTTPTestServer,
                                                    tmp_path: Path) -> None:
    _, url = _put(https_server)
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("not a certificate\n")
    with pytest.raises(errors.ConfigurationError, match="cannot load the CA bundle") as info:
        tensorstream.open(url, ca_bundle=str(bundle), retries=3).close()
    assert str(bundle) in str(info.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_ca_directory_is_trusted(https_server: HTTPTestServer, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # ca_bundle= and REQUESTS_CA_BUNDLE take a directory (as requests' verify= does);
    # it was passed to OpenSSL as a file and every read failed.
    _, url = _put(https_server)
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(str(https_server.ca_bundle_path), certs / "ca.pem")
    subprocess.run(["openssl", "rehash", str(certs)], check=True, capture_output=True)
    with tensorstream.open(url, ca_bundle=str(certs)) as f:
        assert f.read() == DATA
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certs))
    with tensorstream.open(url) as f:
        assert f.read(10) == DATA[:10]


# -- redirects -----------------------------------------------------------------------------
async def test_redirect_to_another_origin_drops_credentials(
        http_server: HTTPTestServer, https_server: HTTPTestServer) -> None:
    key, _ = _put(https_server)
    http_server.faults.redirect_to = https_server.base_url
    opts = {"token": HTTP_TEST_TOKEN, "headers": {"X-Api-Key": "hdr-canary"},
            "ca_bundle": https_server.ca_bundle_path}
    got = await tensorstream.read_range(http_server.url(key), 0, 1000, **opts)
    assert got == DATA[:1000]
    first = http_server.requests_for(key)[0]
    assert first.status == 307 and first.headers["Authorization"] == f"Bearer {HTTP_TEST_TOKEN}"
    landed = https_server.requests_for(key)
    assert landed and all("Authorization" not in r.headers and "X-Api-Key" not in r.headers
                          for r in landed)


async def test_https_to_http_downgrade_drops_credentials(
        http_server: HTTPTestServer, https_server: HTTPTestServer) -> None:
    key, _ = _put(http_server)
    https_server.faults.redirect_to = http_server.base_url
    got = await tensorstream.read_range(https_server.url(key), 0, 10, token=HTTP_TEST_TOKEN,
                                        ca_bundle=https_server.ca_bundle_path)
    assert got == DATA[:10]
    assert all("Authorization" not in r.headers for r in http_server.requests_for(key))


async def test_a_refusal_after_credentials_were_dropped_at_a_redirect_says_so(
        http_server: HTTPTestServer) -> None:
    # http://host -> https://host (nginx's "return 301 https://...") leaves the origin, so
    # the token is dropped; the 401 said "sent the Authorization from argument token".
    with HTTPTestServer(token="other-origin-token", tls=True) as secured:
        key, _ = _put(secured)
        http_server.faults.redirect_to = secured.base_url
        opts = {"token": HTTP_TEST_TOKEN, "ca_bundle": secured.ca_bundle_path, "retries": 1}
        for call in (tensorstream.stat(http_server.url(key), **opts),  # HEAD
                     tensorstream.read_range(http_server.url(key), 0, 10, **opts)):  # GET
            with pytest.raises(PermissionError) as info:
                await call
            message = str(info.value)
            assert "redirect to another origin" in message
            assert "was sent to the first origin only" in message
            assert "sent the Authorization" not in message and HTTP_TEST_TOKEN not in message


async def test_same_origin_redirect_keeps_credentials(
        http_token_server: HTTPTestServer) -> None:
    key = f"old-{uuid.uuid4().hex[:8]}"
    http_token_server.put(f"new/{key}", DATA)
    http_token_server.faults.key = key
    http_token_server.faults.redirect_to = http_token_server.base_url + "/new"
    got = await tensorstream.read_range(http_token_server.url(key), 0, 10, token=HTTP_TEST_TOKEN)
    assert got == DATA[:10]
    assert http_token_server.requests_for(f"new/{key}")[0].status == 206


async def test_redirect_to_metadata_address_is_refused(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.redirect_to = "http://169.254.169.254"
    with pytest.raises(errors.PermissionDeniedError, match="link-local"):
        await tensorstream.stat(url)
    assert len(http_server.requests_for(key)) == 1  # refused without retrying
    # The allow_private_redirects=True path is not exercised over the network on
    # purpose: tests must never send requests to a real metadata endpoint.


@pytest.mark.parametrize(("address", "private"), [
    ("169.254.169.254", True), ("169.254.0.1", True), ("fd00:ec2::254", True),
    ("[fe80::1]", True), ("::ffff:169.254.169.254", True), ("127.0.0.1", False),
    ("10.0.0.1", False), ("example.com", False), ("fd00:ec2::253", False)])
def test_metadata_address_detection(address: str, private: bool) -> None:
    assert is_metadata_address(address) is private


async def test_redirect_loop_is_bounded(http_server: HTTPTestServer) -> None:
    key, url = _put(http_server)
    http_server.faults.redirect_to = http_server.base_url  # redirects to itself forever
    with pytest.raises(errors.ProtocolError, match="redirects"):
        await tensorstream.stat(url)
    assert len(http_server.requests_for(key)) == 6


async def test_presigned_secret_not_in_retry_errors_or_debug_logs(
        http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    _, url = _put(http_server)
    http_server.faults.status_script = [503] * 3
    caplog.set_level(logging.DEBUG)
    with pytest.raises(errors.RetriesExhaustedError) as info:
        await tensorstream.read_range(url + "?X-Amz-Signature=sig-canary", 0, 10,
                                      retries=2, backoff_initial=0.01)
    assert "X-Amz-Signature=***" in str(info.value)
    assert "sig-canary" not in f"{info.value} {info.value!r} {info.value.path} {caplog.text}"


# -- query values under any name -----------------------------------------------------------
UNKNOWN = "CANARY-qu3ry-v4lue"


@pytest.mark.parametrize("fault", ["404", "503", "redirect_loop", "refused", "total_timeout",
                                   "idle_timeout"])
async def test_a_query_value_under_an_unknown_name_is_never_shown(
        http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture, fault: str) -> None:
    """A token in a query parameter of a name no list knows (``?hmac=``, a vendor's own
    ``?zz9=``) was shown in errors, their chained causes and DEBUG logs: only known names
    were redacted. Every query value of an HTTP(S) URL is hidden now, the names kept."""
    _, url = _put(http_server)
    caplog.set_level(logging.DEBUG)
    if fault == "404":
        url = http_server.url("missing")
    elif fault == "503":
        http_server.faults.status_script = [503] * 3
    elif fault == "redirect_loop":
        http_server.faults.redirect_to = http_server.base_url
    elif fault.endswith("timeout"):
        http_server.faults.stall_after_headers = 3
    else:
        url = url.replace(f":{http_server.port}/", f":{_closed_port()}/")
    timeouts = {"total_timeout": {"timeout_total": 0.3}, "idle_timeout": {"timeout_idle": 0.3}}
    with pytest.raises(errors.TensorstreamError) as info:
        await tensorstream.read_range(f"{url}?zz9={UNKNOWN}&hmac={UNKNOWN}x", 0, 10,
                                      retries=2, backoff_initial=0.01,
                                      **timeouts.get(fault, {}))
    said = ("".join(traceback.format_exception(info.value)) + repr(info.value)
            + repr(info.value.args) + str(info.value.path) + caplog.text)
    assert UNKNOWN not in said, said
    assert "zz9=***" in said, said


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_changed_object_and_a_stat_never_show_a_query_value(
        http_server: HTTPTestServer, caplog: pytest.LogCaptureFixture) -> None:
    """The same through a file: its pinned object replaced between parts, its ``stat``'s
    ``ObjectInfo`` repr, its read-ahead's DEBUG lines."""
    _, url = _put(http_server)
    caplog.set_level(logging.DEBUG)
    url = f"{url}?zz9={UNKNOWN}"
    info = tensorstream.stat(url)
    with tensorstream.open(url, part_size=64 << 10, concurrency=2, stream_reads=False,
                           backoff_initial=0.01) as f:
        http_server.faults.replace_after_requests = 1
        with pytest.raises(errors.ObjectChangedError) as changed:
            f.read()
    said = ("".join(traceback.format_exception(changed.value)) + repr(changed.value)
            + repr(info) + repr(f) + caplog.text)
    assert UNKNOWN not in said, said
    assert "zz9=***" in said, said
