"""HTTP(S) reads through a real forward proxy on loopback (``ForwardProxy``):
https through a CONNECT tunnel, http in absolute form, credentials from the
proxy URL, the environment's variables as requests reads them, and refusals
that name the proxy and never its password."""

from __future__ import annotations

import os
import pickle
import socket
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.config import Timeouts
from tensorstream.providers._http import range_get
from tensorstream.providers._http.proxies import resolve_proxies
from tensorstream.testing.forward_proxy import ForwardProxy
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

DATA = os.urandom((3 << 20) + 517)
USER, PASSWORD = "proxy-user-7f", "proxy-pw-canary-31"
QUICK = {"retries": 3, "backoff_initial": 0.01, "backoff_max": 0.02}


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with ForwardProxy(user=USER, password=PASSWORD) as server:
        yield server


@pytest.fixture(params=["http", "https"])
def server(request: pytest.FixtureRequest, http_server: HTTPTestServer,
           https_server: HTTPTestServer) -> HTTPTestServer:
    return http_server if request.param == "http" else https_server


def _put(server: HTTPTestServer) -> str:
    key = f"proxied-{uuid.uuid4().hex[:10]}.bin"
    server.put(key, DATA)
    return server.url(key)


def _read(url: str, **options: object) -> bytes:
    with tensorstream.open(url, "rb", **options) as f:
        return f.read()


def _everything_said(exc: BaseException) -> str:
    """The error as a user sees it: messages, reprs and the printed chain."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.mark.parametrize("how", ["option", "env"])
def test_reads_through_the_proxy_are_exact(server: HTTPTestServer, proxy: ForwardProxy,
                                           how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _put(server)
    options = dict(server.options)
    if how == "option":
        options["proxy"] = proxy.url_with(USER, PASSWORD)
    else:
        monkeypatch.setenv(f"{url.partition(':')[0].upper()}_PROXY",
                           proxy.url_with(USER, PASSWORD))
    assert _read(url, **options, part_size=1 << 20, stream_reads=False) == DATA
    assert proxy.log and all(e.authorized for e in proxy.log)
    origin = url.split("/")[2]
    if server.tls:  # a tunnel: the proxy sees CONNECT only, TLS to the origin inside
        assert {(e.method, e.target, e.status) for e in proxy.log} == {("CONNECT", origin, 200)}
    else:  # absolute form: the proxy sees every request
        assert {e.method for e in proxy.log} >= {"GET"}
        assert all(e.target == url and e.status in (200, 206) for e in proxy.log)


def test_connections_through_the_tunnel_are_reused(https_server: HTTPTestServer,
                                                   proxy: ForwardProxy) -> None:
    url = _put(https_server)
    settings = resolve_proxies(proxy.url_with(USER, PASSWORD))
    pool = range_get.ConnectionPool(
        range_get.TLSSettings(ca_bundle=str(https_server.ca_bundle_path)), proxies=settings)
    try:
        for start in (0, 1000, 2 << 20):
            body = range_get.open_range(pool, url, start, start + 4096, {}, None, Timeouts())
            buf = bytearray(4096)
            body.readinto(memoryview(buf))
            assert bytes(buf) == DATA[start:start + 4096]
        assert pool.created == 1 and proxy.connections == 1
        assert [e.method for e in proxy.log] == ["CONNECT"]
    finally:
        pool.close()


@pytest.mark.parametrize("no_proxy, bypassed", [
    ("127.0.0.1", True),
    ("127.0.0.0/8", True),          # a CIDR network (requests matches them; urllib does not)
    ("other.example, *", True),
    ("{port_entry}", True),         # host:port of the server
    ("127.0.0.1:1", False),         # the host at another port
    ("127.0.0.2,10.0.0.0/8", False),
    ("example.com", False),
])
def test_no_proxy_bypasses_the_proxy(server: HTTPTestServer, proxy: ForwardProxy,
                                     monkeypatch: pytest.MonkeyPatch, no_proxy: str,
                                     bypassed: bool) -> None:
    url = _put(server)
    monkeypatch.setenv("ALL_PROXY", proxy.url_with(USER, PASSWORD))
    monkeypatch.setenv("no_proxy", no_proxy.format(port_entry=url.split("/")[2]))
    assert _read(url, **server.options) == DATA
    assert bool(proxy.log) is not bypassed


@pytest.mark.parametrize("off", [False, "false", "off"])  # "false": a config file's or argv's
def test_proxy_false_ignores_the_environment(server: HTTPTestServer, proxy: ForwardProxy,
                                             monkeypatch: pytest.MonkeyPatch,
                                             off: object) -> None:
    url = _put(server)
    for name in ("HTTP_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url_with(USER, PASSWORD))
    assert _read(url, **server.options, proxy=off) == DATA
    assert proxy.log == []


@pytest.mark.parametrize("password", [None, "wrong-password-zz"])
def test_a_407_names_the_proxy_never_the_password(server: HTTPTestServer, proxy: ForwardProxy,
                                                  password: str | None) -> None:
    url = _put(server)
    given = proxy.url_with(USER, password) if password else proxy.url
    with pytest.raises(errors.ConnectionFailedError) as info:
        _read(url, **server.options, proxy=given, **QUICK)
    said = _everything_said(info.value)
    assert f"the proxy 127.0.0.1:{proxy.port} (from argument proxy) refused" in said
    assert "407" in said
    assert ("give them in the proxy URL" in said) is (password is None)
    assert "wrong-password-zz" not in said and PASSWORD not in said and USER not in said
    assert not info.value.temporary
    assert len(proxy.log) == 1  # the proxy's refusal is not retried as the origin's failure


@pytest.mark.parametrize("status", [403, 502])
def test_a_refused_tunnel_names_the_proxy_and_is_not_retried(
        https_server: HTTPTestServer, proxy: ForwardProxy, status: int) -> None:
    url = _put(https_server)
    proxy.refuse_connect = status
    with pytest.raises(errors.ConnectionFailedError) as info:
        _read(url, **https_server.options, proxy=proxy.url_with(USER, PASSWORD), **QUICK)
    said = _everything_said(info.value)
    assert f"the proxy 127.0.0.1:{proxy.port} (from argument proxy) refused the tunnel" in said
    assert str(status) in said and PASSWORD not in said
    assert len(proxy.log) == 1


def test_an_unreachable_proxy_is_named_without_its_credentials(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = _put(http_server)
    monkeypatch.setenv("http_proxy", f"http://{USER}:{PASSWORD}@127.0.0.1:{port}")
    with pytest.raises(errors.TensorstreamError) as info:
        _read(url, retries=1)
    said = _everything_said(info.value)
    assert f"through the proxy 127.0.0.1:{port} (from http_proxy)" in said
    assert PASSWORD not in said and USER not in said
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # bypassed: read directly
    assert _read(url) == DATA


def test_proxy_settings_hide_credentials_and_refuse_pickling() -> None:
    settings = resolve_proxies(f"http://{USER}:{PASSWORD}@proxy.example:3128")
    pool = range_get.ConnectionPool(proxies=settings)
    for shown in (repr(settings), repr(pool), str(settings)):
        assert PASSWORD not in shown and USER not in shown
        assert "proxy.example:3128" in shown
    with pytest.raises(TypeError):
        pickle.dumps(settings)


@pytest.mark.parametrize("env, https, http", [
    ({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"}, "lower:2", None),
    ({"ALL_PROXY": "http://all:3", "HTTP_PROXY": "http://plain:4"}, "all:3", "plain:4"),
    ({"https_proxy": "proxy.example:3128"}, "proxy.example:3128", None),  # bare host:port
    ({"http_proxy": "http://p:5", "REQUEST_METHOD": "GET", "HTTP_PROXY": "http://p:6"},
     None, "p:5"),
    ({"HTTP_PROXY": "http://p:6", "REQUEST_METHOD": "GET"}, None, None),  # CGI: httpoxy
    ({"HTTPS_PROXY": "http://p:7", "https_proxy": ""}, None, None),  # empty lower-case unsets
    ({"https_proxy": "http://p"}, "p:80", None),
])
def test_environment_variables_are_read_as_urllib_reads_them(
        env: dict[str, str], https: str | None, http: str | None) -> None:
    settings = resolve_proxies(None, env=env)
    got = [settings.for_origin(s, "models.example.com", p) for s, p in (("https", 443),
                                                                          ("http", 80))]
    assert [g.where if g else None for g in got] == [https, http]


@pytest.mark.parametrize("value", ["https://proxy.example:443", "socks5://proxy:1080", "http://",
                                   123])
def test_an_unsupported_proxy_is_a_configuration_error(value: object) -> None:
    with pytest.raises(errors.ConfigurationError) as info:
        resolve_proxies(value)
    assert "proxy" in str(info.value)


@pytest.mark.parametrize("how", ["option", "env"])
def test_an_https_proxy_is_refused_with_what_to_write_instead(
        http_server: HTTPTestServer, proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    # TLS to the proxy itself (and TLS inside it to an https origin) is not what
    # the data plane's http.client connections can do; most proxies given as
    # https:// take plain HTTP on that port, which is what the message says to write.
    url = _put(http_server)
    given = f"https://{USER}:{PASSWORD}@127.0.0.1:{proxy.port}"
    options: dict[str, object] = {}
    if how == "option":
        options["proxy"] = given
    else:
        monkeypatch.setenv("HTTP_PROXY", given)
    with pytest.raises(errors.ConfigurationError) as info:
        _read(url, **options)
    said = _everything_said(info.value)
    source = "argument proxy" if how == "option" else "HTTP_PROXY"
    assert f"{source} is an https:// proxy (TLS to the proxy)" in said
    # what to write instead
    assert f"http://127.0.0.1:{proxy.port} with the same user and password" in said
    assert "CONNECT tunnel" in said and "stunnel" in said
    assert PASSWORD not in said and USER not in said
    assert proxy.log == []
    # and written as the message says, the same proxy carries the read
    assert _read(url, proxy=proxy.url_with(USER, PASSWORD)) == DATA
    assert {e.target for e in proxy.log} == {url}


def test_an_unusable_proxy_in_the_environment_fails_only_the_requests_it_would_carry(
        http_server: HTTPTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # ALL_PROXY=socks5://... is often set for other tools: a request NO_PROXY exempts
    # must still work, and one that would go through it must say why it cannot.
    url = _put(http_server)
    monkeypatch.setenv("ALL_PROXY", f"socks5://{USER}:{PASSWORD}@127.0.0.1:1080")
    with pytest.raises(errors.ConfigurationError) as info:
        _read(url)
    said = _everything_said(info.value)
    assert "ALL_PROXY is a socks5:// proxy" in said and "NO_PROXY" in said
    assert PASSWORD not in said
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert _read(url) == DATA


def test_an_ipv6_origin_is_bracketed_in_the_connect_line(tmp_path: Path) -> None:
    # Python before 3.12 wrote 'CONNECT ::1:PORT', which proxies refuse; the TLS name
    # and the Host header must stay as without a proxy.
    import http.server
    import ssl
    import threading

    import trustme

    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    ca = trustme.CA()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = f"host={self.headers['Host']}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    server = Server(("::1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("::1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    try:
        with ForwardProxy() as proxy:
            pool = range_get.ConnectionPool(range_get.TLSSettings(ca_bundle=str(tmp_path / "ca.pem")),
                                            proxies=resolve_proxies(proxy.url))
            answer = range_get.request(pool, f"https://[::1]:{port}/x", "GET", {}, Timeouts(),
                                       path="/x")
            pool.close()
        assert (answer.status, answer.body) == (200, f"host=[::1]:{port}".encode())
        assert [(e.method, e.target) for e in proxy.log] == [("CONNECT", f"[::1]:{port}")]
    finally:
        server.shutdown()
        server.server_close()
