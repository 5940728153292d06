"""Where env ``TENSORSTREAM_HTTP_TOKEN`` is sent (:mod:`tensorstream.providers.http.config`):
to the hosts ``TENSORSTREAM_HTTP_TOKEN_HOSTS`` names, else to https:// servers and loopback
ones, never in plain text to another server. A real server on this machine's own
non-loopback address says what arrived."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.providers.http.config import resolve_http_credentials
from tensorstream.uri import parse_uri

TOKEN = "ambient-token-0123456789abcdef"


def _own_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.fixture
def plain_server() -> Iterator[tuple[str, list[str | None]]]:
    """A plain http:// server on this machine's non-loopback address: every GET/HEAD is
    answered 401, and the Authorization each carried is kept."""
    address = _own_address()
    if address is None:
        pytest.skip("no non-loopback address on this machine")
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _refuse

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("url, env, sent", [
    ("https://models.example.com/m", {}, True),
    ("http://127.0.0.1:8080/m", {}, True),
    ("http://localhost/m", {}, True),
    ("http://[::1]:8080/m", {}, True),
    ("http://models.example.com/m", {}, False),
    ("http://10.0.0.7/m", {}, False),
    ("http://models.example.com/m", {"TENSORSTREAM_HTTP_TOKEN_HOSTS": "models.example.com"}, True),
    ("https://cdn.other.org/m", {"TENSORSTREAM_HTTP_TOKEN_HOSTS": ".example.com"}, False),
    ("https://hub.example.com/m", {"TENSORSTREAM_HTTP_TOKEN_HOSTS": ".example.com"}, True),
    ("https://hub.example.com:8443/m", {"TENSORSTREAM_HTTP_TOKEN_HOSTS": "hub.example.com:443"},
     False),
    ("http://127.0.0.1/m", {"TENSORSTREAM_HTTP_TOKEN_HOSTS": "hub.example.com"}, False),
])
def test_the_ambient_token_goes_where_it_is_meant_to(url: str, env: dict[str, str],
                                                      sent: bool) -> None:
    creds = resolve_http_credentials(parse_uri(url), env={"TENSORSTREAM_HTTP_TOKEN": TOKEN, **env})
    assert (creds.authorization is not None) is sent
    assert (creds.withheld is None) is sent
    if not sent:
        assert TOKEN not in str(creds.withheld) and "TENSORSTREAM_HTTP_TOKEN" in str(creds.withheld)


def test_an_explicit_token_is_sent_as_given_in_plain_text_too() -> None:
    creds = resolve_http_credentials(parse_uri("http://models.example.com/m"), token=TOKEN,
                                     env={"TENSORSTREAM_HTTP_TOKEN": "other"})
    assert creds.authorization is not None and creds.authorization.value == f"Bearer {TOKEN}"


def test_a_plain_http_server_elsewhere_is_never_sent_the_ambient_token(
        plain_server: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An ambient token went to every server read from, plain http:// ones included, where
    anyone on the path reads it. Now: not sent, said once, and the refusal says why."""
    url, seen = plain_server
    monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN", TOKEN)
    monkeypatch.delenv("TENSORSTREAM_HTTP_TOKEN_HOSTS", raising=False)
    with caplog.at_level(logging.WARNING, logger="tensorstream"), \
            pytest.raises(errors.PermissionDeniedError) as info:
        tensorstream.open(f"{url}/model.bin").read()
    assert seen and all(auth is None for auth in seen), seen
    assert "is not sent to http://" in str(info.value) and TOKEN not in str(info.value)
    said = [r.getMessage() for r in caplog.records if "is not sent to" in r.getMessage()]
    assert len(said) == 1 and TOKEN not in said[0]

    seen.clear()
    host = url.split("//", 1)[1].rsplit(":", 1)[0]
    monkeypatch.setenv("TENSORSTREAM_HTTP_TOKEN_HOSTS", host)
    with pytest.raises(errors.PermissionDeniedError) as info:
        tensorstream.open(f"{url}/model.bin").read()
    assert seen and all(auth == f"Bearer {TOKEN}" for auth in seen), seen
    assert "sent the Authorization from env TENSORSTREAM_HTTP_TOKEN" in str(info.value)
