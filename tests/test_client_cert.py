"""A server that requires a TLS client certificate: the error says so and names the
options that supply one (was OpenSSL's alert name, then advice to pass a CA bundle).

Real servers that send the alerts: ``openssl s_server -Verify 1 -verify_return_error`` for
HTTPS and S3 (as Go servers such as MinIO do; nginx answers 400 instead) and redis-server
with ``tls-auth-clients yes``; certificates from trustme. moto's server (Python's ``ssl``)
proves S3 sends a client certificate, but may close without the alert.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.testing.redis_server import RedisServer
from tensorstream.testing.s3_server import MotoS3Server

REQUIRED = "the server requires a TLS client certificate and got none: pass client_cert="
REFUSED = "the server refused the TLS client certificate"


class OpenSSLServer:
    """``openssl s_server`` on 127.0.0.1 requiring a client certificate of its CA."""

    def __init__(self, directory: Path) -> None:
        import trustme

        self.ca = trustme.CA()
        self.ca_file = str(directory / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert_file = str(directory / "server.pem")
        server.private_key_and_cert_chain_pem.write_to_path(self.cert_file)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["openssl", "s_server", "-accept", f"127.0.0.1:{self.port}", "-cert",
             self.cert_file, "-CAfile", self.ca_file, "-Verify", "1", "-verify_return_error",
             "-www", "-quiet"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("openssl s_server did not start") from None
                time.sleep(0.05)

    def url(self, path: str = "x") -> str:
        return f"https://127.0.0.1:{self.port}/{path}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def openssl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenSSLServer]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    server = OpenSSLServer(tmp_path_factory.mktemp("openssl-mtls"))
    yield server
    server.stop()


def _foreign_cert(directory: Path) -> tuple[str, str]:
    """A client certificate from a CA the server does not trust."""
    import trustme

    issued = trustme.CA().issue_cert("client")
    cert, key = directory / "foreign.pem", directory / "foreign.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


async def test_https_without_a_client_certificate_says_the_server_requires_one(
        isolated_env: Path, openssl_server: OpenSSLServer) -> None:
    with pytest.raises(errors.ConnectionFailedError) as info:
        await tensorstream.read_range(openssl_server.url(), 0, 1, retries=3,
                                      ca_bundle=openssl_server.ca_file)
    assert REQUIRED in str(info.value) and "client_key=" in str(info.value)
    assert "ca_bundle" not in str(info.value)  # the server's certificate was fine
    assert not info.value.temporary


async def test_s3_without_a_client_certificate_says_the_server_requires_one(
        isolated_env: Path, openssl_server: OpenSSLServer) -> None:
    endpoint = openssl_server.url("").rstrip("/")
    with pytest.raises(errors.ConnectionFailedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/k", 0, 1, s3_endpoint=endpoint,
                                      s3_access_key_id="AKIAEXAMPLEEXAMPLE00",
                                      s3_secret_access_key="s", retries=3,
                                      ca_bundle=openssl_server.ca_file)
    assert REQUIRED in str(info.value) and not info.value.temporary


def test_https_with_a_client_certificate_it_does_not_trust_says_it_was_refused(
        isolated_env: Path, openssl_server: OpenSSLServer, tmp_path: Path) -> None:
    cert, key = _foreign_cert(tmp_path)
    with pytest.raises(errors.ConnectionFailedError) as info:
        with tensorstream.open(openssl_server.url(), retries=1, ca_bundle=openssl_server.ca_file,
                               client_cert=cert, client_key=key) as f:
            f.read()
    assert REFUSED in str(info.value) and "client_cert=" in str(info.value)


async def test_redis_without_a_client_certificate_says_the_server_requires_one(
        isolated_env: Path, redis_mtls_server: RedisServer, tmp_path: Path) -> None:
    srv = redis_mtls_server
    with pytest.raises(errors.ConnectionFailedError) as info:
        await tensorstream.read_range(srv.url("mtls/none"), 0, 1, ca_bundle=srv.ca_file,
                                      retries=3)
    assert REQUIRED in str(info.value)
    assert not info.value.temporary
    cert, key = _foreign_cert(tmp_path)
    with pytest.raises(errors.ConnectionFailedError) as info:
        await tensorstream.read_range(srv.url("mtls/none"), 0, 1, ca_bundle=srv.ca_file,
                                      client_cert=cert, client_key=key, retries=1)
    assert REFUSED in str(info.value)


def _encrypted_key(key_file: str, directory: Path) -> str:
    """``key_file`` re-written under a pass phrase (``openssl pkey -aes256``)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(key_file).read_bytes(), None)
    encrypted = directory / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass phrase")))
    return str(encrypted)


async def test_redis_client_certificate_that_cannot_be_loaded_is_said_so_like_https(
        isolated_env: Path, redis_mtls_server: RedisServer, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A key that is encrypted, of another certificate, or a file that is no PEM: the
    ConfigurationError HTTPS gives, at once. Redis asked OpenSSL's pass phrase prompt on
    the terminal (a service waits there), retried the rest as connection failures."""
    srv = redis_mtls_server
    cert, key = srv.issue_client_cert("loaded")
    _, other_key = _foreign_cert(tmp_path)
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("token=hunter2-not-a-certificate\n")
    cases = [(cert, _encrypted_key(key, tmp_path), "encrypted"),
             (cert, other_key, "KEY_VALUES_MISMATCH"), (str(not_pem), None, "PEM")]
    for client_cert, client_key, why in cases:
        options = {"client_cert": client_cert, **({"client_key": client_key} if client_key else {})}
        with pytest.raises(errors.ConfigurationError) as info:
            await tensorstream.read_range(srv.url("mtls/k"), 0, 1, ca_bundle=srv.ca_file,
                                          retries=3, **options)
        message = str(info.value)
        assert f"cannot load the client certificate {client_cert}" in message, message
        assert why in message and "hunter2" not in message
        assert "pass phrase" not in capfd.readouterr().err  # OpenSSL's prompt never shown
    # the loadable pair still connects (the refusal is about the files, not the server)
    with pytest.raises(errors.NotFoundError):
        await tensorstream.read_range(srv.url("mtls/absent"), 0, 1, ca_bundle=srv.ca_file,
                                      client_cert=cert, client_key=key)


@pytest.fixture(scope="module")
def moto_s3_mtls() -> Iterator[MotoS3Server]:
    with MotoS3Server(require_client_cert=True) as server:
        server.create_bucket(S3_BUCKET)
        server.put(S3_BUCKET, "mtls", b"over mutual TLS")
        yield server


async def test_s3_takes_a_client_certificate_for_reads_listings_and_writes(
        isolated_env: Path, moto_s3_mtls: MotoS3Server, tmp_path: Path) -> None:
    """S3 had no option for one (botocore takes it; the reads' own HTTP client too)."""
    srv = moto_s3_mtls
    uri = f"s3://{S3_BUCKET}/mtls"
    # without one: refused (the words of the alert are tested against openssl, above:
    # Python's ssl server sends it or closes first, by a race)
    without = srv.options(client_cert=None, client_key=None)
    with pytest.raises(errors.ConnectionFailedError):
        await tensorstream.read_range(uri, 0, 4, **without)
    opts = srv.options()
    assert await tensorstream.read_range(uri, 0, 4, **opts) == b"over"
    with tensorstream.open(uri, **opts) as f:
        assert f.read() == b"over mutual TLS"
    with tensorstream.open(f"s3://{S3_BUCKET}/written", "wb", **opts) as f:
        f.write(b"written over mutual TLS")
    assert srv.get(S3_BUCKET, "written") == b"written over mutual TLS"
    async with tensorstream.get_provider(uri, **opts) as provider:
        names = [info.path async for info in provider.list(S3_BUCKET + "/")]
    assert f"{S3_BUCKET}/mtls" in names
    # a certificate of another CA: refused (Python's ssl server closes without the alert
    # that names why, so only the refusal is certain here; openssl's is tested above)
    cert, key = _foreign_cert(tmp_path)
    with pytest.raises(errors.ConnectionFailedError):
        await tensorstream.read_range(uri, 0, 4, **srv.options(client_cert=cert, client_key=key))


async def test_s3_client_certificate_that_cannot_be_loaded_is_said_so_at_once(
        isolated_env: Path, moto_s3_mtls: MotoS3Server, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """botocore loads the pair itself (a write's PutObject): an encrypted key made OpenSSL
    prompt for a pass phrase on the terminal at each attempt, then "cannot reach" the
    endpoint; a key of another certificate was a retried connection error."""
    srv = moto_s3_mtls
    opts = srv.options()
    cert, key = opts["client_cert"], opts["client_key"]
    _, other_key = _foreign_cert(tmp_path)
    uri = f"s3://{S3_BUCKET}/mtls"
    for bad_key, why in ((_encrypted_key(key, tmp_path), "encrypted"),
                         (other_key, "KEY_VALUES_MISMATCH")):
        with pytest.raises(errors.ConfigurationError) as info, \
                tensorstream.open(uri + "-w", "wb", **{**opts, "client_key": bad_key}) as f:
            f.write(b"one PutObject, sent by botocore")
        assert f"cannot load the client certificate {cert}" in str(info.value)
        assert why in str(info.value)
        assert "pass phrase" not in capfd.readouterr().err


def _cli(*argv: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_the_cli_takes_a_client_certificate_on_every_command(
        isolated_env: Path, moto_s3_mtls: MotoS3Server, openssl_server: OpenSSLServer,
        tmp_path: Path) -> None:
    """client_cert=/client_key= had no flag: a CLI user could not reach a server that
    requires a client certificate, and the error told them to pass client_cert=. The
    flags (curl's --cert too) work on every command, per side on cp/sync, and errors
    name them."""
    srv = moto_s3_mtls
    opts = srv.options()
    env = {"AWS_ACCESS_KEY_ID": opts["s3_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": opts["s3_secret_access_key"], "AWS_REGION": opts["s3_region"]}
    where = ["--endpoint-url", opts["s3_endpoint"], "--ca-bundle", opts["ca_bundle"]]
    tls = ["--client-cert", opts["client_cert"], "--client-key", opts["client_key"]]
    uri = f"s3://{S3_BUCKET}/mtls"
    r = _cli("cat", *where, *tls, uri, env=env)
    assert r.returncode == 0 and r.stdout == "over mutual TLS", r.stderr
    r = _cli(*where, "--cert", opts["client_cert"], "--client-key", opts["client_key"], "stat",
             uri, env=env)  # before the command, and curl's name
    assert r.returncode == 0 and "15" in r.stdout, r.stderr
    r = _cli("ls", *where, *tls, f"s3://{S3_BUCKET}/", env=env)
    assert r.returncode == 0 and "mtls" in r.stdout, r.stderr
    r = _cli("cp", *where, *tls, uri, str(tmp_path / "got"), env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "got").read_bytes() == b"over mutual TLS"
    # one side only: a local source, the destination over mutual TLS
    r = _cli("cp", *where, "--dst-client-cert", opts["client_cert"], "--dst-client-key",
             opts["client_key"], str(tmp_path / "got"), f"s3://{S3_BUCKET}/from-cli", env=env)
    assert r.returncode == 0, r.stderr
    assert srv.get(S3_BUCKET, "from-cli") == b"over mutual TLS"
    r = _cli("rm", *where, *tls, f"s3://{S3_BUCKET}/from-cli", env=env)
    assert r.returncode == 0, r.stderr
    r = _cli("credentials", *where, *tls, uri, env=env)
    assert r.returncode == 0, r.stderr
    # without one: the error names the flags, not the library's options
    r = _cli("cat", "--retries", "1", "--ca-bundle", openssl_server.ca_file, openssl_server.url())
    assert r.returncode == 1
    assert "requires a TLS client certificate" in r.stderr, r.stderr
    assert "--client-cert FILE" in r.stderr and "--client-key FILE" in r.stderr, r.stderr
    assert "client_cert=" not in r.stderr and "client_key=" not in r.stderr, r.stderr


_NGINX_MTLS = """\
{user}
worker_processes 1;
daemon off;
master_process on;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    etag on;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {work}/server.pem;
        ssl_certificate_key {work}/server.pem;
        ssl_client_certificate {work}/ca.pem;
        ssl_verify_client on;
        root {root};
    }}
}}
"""


class NginxMTLS:
    """nginx with ``ssl_verify_client on`` (trustme certificates), serving ``root``."""

    def __init__(self, directory: Path) -> None:
        import trustme

        from benchmarks import servers

        self.root, work = directory / "root", directory / "work"
        (self.root / "b").mkdir(parents=True)
        (self.root / "b" / "k").write_bytes(b"over mutual TLS, nginx")
        work.mkdir()
        ca = trustme.CA()
        self.ca_file = str(work / "ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
            str(work / "server.pem"))
        client = ca.issue_cert("client")
        self.cert, self.key = str(work / "client.pem"), str(work / "client.key")
        client.cert_chain_pems[0].write_to_path(self.cert)
        client.private_key_pem.write_to_path(self.key)
        conf = work / "nginx.conf"

        def argv(port: int) -> list[str]:
            conf.write_text(_NGINX_MTLS.format(
                user="user root;" if os.geteuid() == 0 else "", work=work, port=port,
                root=self.root))
            return [shutil.which("nginx") or "/usr/sbin/nginx", "-e", str(work / "error.log"),
                    "-c", str(conf)]

        self.server = servers.serve_on_a_free_port("nginx", argv)
        self.url = f"https://127.0.0.1:{self.server.port}"


@pytest.fixture(scope="module")
def nginx_mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxMTLS]:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        pytest.skip("needs nginx")
    srv = NginxMTLS(tmp_path_factory.mktemp("nginx-mtls"))
    yield srv
    srv.server.stop()


def test_nginx_answering_400_for_a_missing_client_certificate_says_so(
        isolated_env: Path, nginx_mtls: NginxMTLS, tmp_path: Path) -> None:
    """nginx (ssl_verify_client on) does not end the handshake: it answers 400 "No
    required SSL certificate was sent" (or "The SSL certificate error"). That read as
    "HTTP 400 Bad Request: the server rejected the request". It says what the alerts
    say now, names the options (the CLI's flags), and the right pair reads."""
    srv = nginx_mtls
    url = srv.url + "/b/k"
    with pytest.raises(errors.ConfigurationError) as info:
        with tensorstream.open(url, ca_bundle=srv.ca_file, retries=1) as f:
            f.read()
    message = str(info.value)
    assert "HTTP 400" in message and REQUIRED in message and "client_key=" in message, message
    assert "No required SSL certificate was sent" in message, message
    cert, key = _foreign_cert(tmp_path)
    with pytest.raises(errors.ConfigurationError) as info:
        with tensorstream.open(url, ca_bundle=srv.ca_file, retries=1, client_cert=cert,
                               client_key=key) as f:
            f.read()
    assert REFUSED in str(info.value), str(info.value)
    with tensorstream.open(url, ca_bundle=srv.ca_file, client_cert=srv.cert,
                           client_key=srv.key) as f:
        assert f.read() == b"over mutual TLS, nginx"
    # plain HTTP to its TLS port: nginx answers that with a 400 of its own
    with pytest.raises(errors.ConfigurationError) as info:
        with tensorstream.open(url.replace("https://", "http://"), retries=1) as f:
            f.read()
    assert "use https:// instead of http://" in str(info.value), str(info.value)
    # the command line names its flags
    r = _cli("cat", "--retries", "1", "--ca-bundle", srv.ca_file, url)
    assert r.returncode == 2 and "--client-cert FILE" in r.stderr, r.stderr  # a setting
    assert "client_cert=" not in r.stderr, r.stderr


def test_s3_through_nginx_answering_400_names_the_client_certificate(
        isolated_env: Path, nginx_mtls: NginxMTLS) -> None:
    # S3's HEAD answer has no body to quote: nginx's own 400 (its Server header, no S3
    # error code) is said to be what nginx answers for a missing client certificate
    srv = nginx_mtls
    opts = {"s3_endpoint": srv.url, "s3_access_key_id": "AKIAEXAMPLEEXAMPLE00",
            "s3_secret_access_key": "x" * 40, "s3_region": "us-east-1",
            "ca_bundle": srv.ca_file, "retries": 1}
    with pytest.raises(errors.ConfigurationError) as info:
        with tensorstream.open("s3://b/k", **opts) as f:
            f.read()
    message = str(info.value)
    assert "nginx" in message and "client certificate" in message, message
    assert "client_cert=" in message, message
    with tensorstream.open("s3://b/k", client_cert=srv.cert, client_key=srv.key, **opts) as f:
        assert f.read() == b"over mutual TLS, nginx"


@pytest.mark.parametrize("uri", ["https://127.0.0.1:9/x", f"s3://{S3_BUCKET}/k",
                                 "rediss://127.0.0.1:9/k"])
@pytest.mark.parametrize("flag", ["--cert", "--client-cert", "--client-key"])
def test_curls_cert_colon_password_form_never_shows_the_password(
        isolated_env: Path, tmp_path: Path, uri: str, flag: str) -> None:
    """curl's ``--cert FILE:PASSWORD`` (its pass phrase after a colon), typed as the
    docs point to curl: the error said ``cannot use '/path/client.pem:PASSWORD'``,
    the pass phrase on the terminal and in CI logs. The part after the colon is not
    shown, and the error says what to do instead."""
    cert = tmp_path / "client.pem"
    cert.write_text("not read")
    secret = "hunter2-PASSPHRASE"
    given = ["--client-cert", str(cert)] if flag == "--client-key" else []
    for value in (f"{cert}:{secret}", f"{tmp_path / 'missing.pem'}:{secret}"):
        r = _cli("cat", *given, flag, value, uri)
        assert r.returncode == 2, r.stderr
        assert secret not in r.stderr and secret not in r.stdout, r.stderr
        assert "not shown" in r.stderr and "pass phrase" in r.stderr, r.stderr


def test_a_missing_certificate_file_with_a_colon_is_still_named_up_to_it() -> None:
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.get_provider("https://127.0.0.1:9/x", client_cert="/no/such/dir/c.pem")
    assert "/no/such/dir/c.pem" in str(info.value)  # no colon: the whole path, as before
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.get_provider("https://127.0.0.1:9/x", client_key="/no/dir/k.pem:s3cr3t")
    said = str(info.value)
    assert "/no/dir/k.pem" in said and "s3cr3t" not in said, said


@pytest.mark.parametrize("uri", ["https://127.0.0.1:9/x", f"s3://{S3_BUCKET}/k",
                                 "rediss://127.0.0.1:9/k"])
def test_a_client_key_without_its_certificate_is_refused_at_once_naming_the_flags(
        isolated_env: Path, tmp_path: Path, uri: str) -> None:
    """--client-key without --client-cert: HTTPS and S3 said 'client_key needs
    client_cert' (the library's names); rediss:// tried to connect, 5 times, then said
    'certfile should be a valid filesystem path'. Refused at once, naming the flags."""
    key = tmp_path / "key.pem"
    key.write_text("not read")
    with pytest.raises(errors.ConfigurationError, match="client_key needs client_cert"):
        tensorstream.get_provider(uri, client_key=str(key))
    started = time.monotonic()
    r = _cli("cat", "--retries", "5", "--client-key", str(key), uri)
    assert r.returncode == 2, r.stderr
    assert "--client-key needs --client-cert" in r.stderr, r.stderr
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(("flag", "name"), [("--client-cert", "client_cert"),
                                            ("--client-key", "client_key"),
                                            ("--ca-bundle", "ca_bundle")])
def test_a_tls_file_that_cannot_be_used_is_named_by_its_flag(
        isolated_env: Path, tmp_path: Path, flag: str, name: str) -> None:
    (tmp_path / "cert.pem").write_text("not read")
    given = ["--client-cert", str(tmp_path / "cert.pem")] if flag == "--client-key" else []
    r = _cli("cat", *given, flag, str(tmp_path / "missing.pem"), "https://127.0.0.1:9/x")
    assert r.returncode == 2, r.stderr
    assert f"error: {flag}: cannot use" in r.stderr, r.stderr
    assert f"{name}:" not in r.stderr, r.stderr
