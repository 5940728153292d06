"""``--proxy URL`` and ``--no-proxy`` on the command line: the real CLI in a
subprocess, a real forward proxy on loopback (``ForwardProxy``), real HTTP(S)
and S3 (moto) servers behind it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import cli_env
from cli_env import s3_env
from fixtures_s3 import S3_BUCKET
from tensorstream.testing.forward_proxy import ForwardProxy
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.s3_server import MotoS3Server

pytestmark = pytest.mark.usefixtures("isolated_env", "http_reset")

USER, PASSWORD = "cli-proxy-user", "cli-proxy-pw-canary-58"
DATA = os.urandom(300_000)
_SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with ForwardProxy(user=USER, password=PASSWORD) as server:
        yield server


def _env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The child's environment: no proxy variables but ``extra``'s."""
    env = {k: v for k, v in (base or os.environ).items() if not k.lower().endswith("_proxy")}
    env["PYTHONPATH"] = _SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The shared runner, in ``_env()`` (no proxy variables) unless told another."""
    return cli_env.cli(*argv, env=env or _env())


def _put(server: HTTPTestServer) -> str:
    key = f"cli-proxy-{uuid.uuid4().hex[:8]}.bin"
    server.put(key, DATA)
    return server.url(key)


def _tls(server: HTTPTestServer) -> list[str]:
    return ["--ca-bundle", str(server.ca_bundle_path)] if server.tls else []


@pytest.mark.parametrize("tls", [False, True])
@pytest.mark.parametrize("where", ["after", "before"])  # as every storage flag: either side
def test_proxy_carries_a_copy_exactly(http_server: HTTPTestServer, https_server: HTTPTestServer,
                                      proxy: ForwardProxy, tmp_path: Path, tls: bool,
                                      where: str) -> None:
    server = https_server if tls else http_server
    url = _put(server)
    flags = ["--proxy", proxy.url_with(USER, PASSWORD), *_tls(server)]
    out = tmp_path / "out.bin"
    argv = ["cp", *flags, url, str(out)] if where == "after" else [*flags, "cp", url, str(out)]
    r = cli(*argv)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == DATA
    assert proxy.log and all(e.authorized for e in proxy.log)
    origin = url.split("/")[2]
    if tls:  # the proxy sees a tunnel only
        assert {(e.method, e.target) for e in proxy.log} == {("CONNECT", origin)}
    else:
        assert {e.target for e in proxy.log} == {url}
    assert PASSWORD not in r.stderr + r.stdout


def test_proxy_wins_over_the_environment_and_its_no_proxy(http_server: HTTPTestServer,
                                                          proxy: ForwardProxy,
                                                          tmp_path: Path) -> None:
    # As proxy= does: the proxy named on the command line takes every request.
    url = _put(http_server)
    env = _env(HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")
    out = tmp_path / "out.bin"
    r = cli("cp", "--proxy", proxy.url_with(USER, PASSWORD), url, str(out), env=env)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == DATA
    assert {e.target for e in proxy.log} == {url}


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_no_proxy_connects_directly_whatever_the_environment_says(
        http_server: HTTPTestServer, proxy: ForwardProxy, tmp_path: Path,
        variable: str) -> None:
    url = _put(http_server)
    env = _env(**{variable: proxy.url_with(USER, PASSWORD)})
    out = tmp_path / "direct.bin"
    r = cli("cp", "--no-proxy", url, str(out), env=env)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == DATA and proxy.log == []
    # without the flag, the same environment goes through the proxy
    r = cli("cp", url, str(tmp_path / "proxied.bin"), env=env)
    assert r.returncode == 0, r.stderr
    assert {e.target for e in proxy.log} == {url}


def test_ls_stat_and_rm_of_s3_go_through_the_proxy(moto_s3: MotoS3Server, proxy: ForwardProxy,
                                                    tmp_path: Path) -> None:
    prefix = f"cli-proxy-{uuid.uuid4().hex[:8]}"
    moto_s3.put(S3_BUCKET, f"{prefix}/a.bin", DATA)
    env = _env(s3_env(moto_s3, tmp_path))
    flags = ["--endpoint-url", moto_s3.endpoint_url, "--proxy", proxy.url_with(USER, PASSWORD)]
    uri = f"s3://{S3_BUCKET}/{prefix}/"
    for argv in (["ls", *flags, uri], ["stat", *flags, f"{uri}a.bin"],
                 ["rm", *flags, f"{uri}a.bin"]):
        before = len(proxy.log)
        r = cli(*argv, env=env)
        assert r.returncode == 0, (argv[0], r.stderr)
        assert len(proxy.log) > before, argv[0]
    assert all(e.authorized for e in proxy.log)
    seen = len(proxy.log)
    r = cli("ls", "--no-proxy", "--endpoint-url", moto_s3.endpoint_url, uri,
            env={**env, "HTTP_PROXY": proxy.url_with(USER, PASSWORD)})
    assert r.returncode == 1 and "no objects at" in r.stderr, r.stderr  # the rm went through
    assert len(proxy.log) == seen


def test_proxy_and_no_proxy_together_are_a_usage_error(http_server: HTTPTestServer) -> None:
    url = _put(http_server)
    for argv in (["stat", "--proxy", "http://127.0.0.1:9", "--no-proxy", url],
                 ["--no-proxy", "stat", "--proxy", "http://127.0.0.1:9", url]):
        r = cli(*argv)
        assert r.returncode == 2, r.stderr
        assert "--proxy and --no-proxy" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_proxy_is_a_usage_error_that_says_what_to_give(
        http_server: HTTPTestServer, value: str) -> None:
    r = cli("stat", "--proxy", value, _put(http_server))
    assert r.returncode == 2 and r.stdout == ""
    assert "--proxy" in r.stderr and "http://" in r.stderr and "--no-proxy" in r.stderr


@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_the_proxy_password_is_never_printed(http_server: HTTPTestServer, proxy: ForwardProxy,
                                             debug: list[str]) -> None:
    url = _put(http_server)
    for given in (proxy.url_with(USER, "wrong-pw-canary-77"),  # a 407
                  "socks5://someone:socks-pw-canary-12@127.0.0.1:1080",  # unsupported
                  "http://someone:unreachable-pw-canary-3@127.0.0.1:9"):  # nobody listens
        r = cli("stat", *debug, "--retries", "1", "--proxy", given, url)
        assert r.returncode != 0, given
        assert "proxy" in r.stderr, r.stderr
        for secret in ("wrong-pw-canary-77", "socks-pw-canary-12", "unreachable-pw-canary-3"):
            assert secret not in r.stderr + r.stdout


def test_an_https_proxy_is_a_usage_error_that_says_what_to_write(
        http_server: HTTPTestServer) -> None:
    r = cli("stat", "--proxy", "https://someone:tls-pw-canary-40@proxy.example:3128",
            _put(http_server))
    assert r.returncode == 2 and r.stdout == ""
    assert "http://proxy.example:3128 with the same user and password" in r.stderr, r.stderr
    assert "tls-pw-canary-40" not in r.stderr and "someone" not in r.stderr


def test_help_documents_both_flags() -> None:
    r = cli("cp", "--help")
    assert r.returncode == 0
    assert "--proxy URL" in r.stdout and "--no-proxy" in r.stdout
