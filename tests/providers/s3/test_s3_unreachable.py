"""An S3 store that cannot be reached is named the same way by every operation: a listing
said ``cannot reach AWS S3 (EndpointConnectionError)`` (no host, no cause) where a read of
the same store said ``cannot connect to b.s3.amazonaws.com:443 (gaierror: ...)``. Each
now names the host and port it tried and why it failed. Every run is bounded: one attempt,
a short connect timeout, and the CLI's own time limit (a resolver that hangs fails the
test, it does not hang it)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from cli_env import cli
from tensorstream.testing.s3_server import isolated_s3_env

#: One attempt, and no waiting long for a connection.
_BOUNDED = ("--retries", "1", "--timeout-connect", "3")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "S3_")) and k.lower() not in ("https_proxy", "http_proxy",
                                                                      "all_proxy")}
    env.update(isolated_s3_env(tmp_path), AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
               AWS_SECRET_ACCESS_KEY="secret-canary", **extra)
    return env


def _nobody_listens() -> int:
    """A loopback port no one listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("argv", [
    ["ls", "s3://tsbucket/p/"], ["ls", "s3://"], ["cat", "s3://tsbucket/k"],
    ["rm", "s3://tsbucket/k"],
], ids=["ls", "ls-buckets", "cat", "rm"])
def test_an_endpoint_nobody_listens_on_is_named_with_its_cause(
        tmp_path: Path, argv: list[str]) -> None:
    port = _nobody_listens()
    r = cli("--endpoint-url", f"http://127.0.0.1:{port}", *_BOUNDED, *argv,
            env=_env(tmp_path))
    assert r.returncode == 1, r.stderr
    assert f"cannot connect to 127.0.0.1:{port} (" in r.stderr, r.stderr
    assert "Connect" in r.stderr.partition(f"127.0.0.1:{port} (")[2], r.stderr  # the cause
    assert "secret-canary" not in r.stderr


@pytest.mark.parametrize("argv", [["ls", "s3://tsbucket/p/"], ["ls", "s3://"],
                                  ["cat", "s3://tsbucket/k"]], ids=["ls", "ls-buckets", "cat"])
def test_aws_s3_that_cannot_be_reached_is_named_by_its_host(
        tmp_path: Path, argv: list[str]) -> None:
    """No endpoint (AWS), in a region whose host name no resolver knows: the listing said
    ``cannot reach AWS S3 (EndpointConnectionError)``; it names the host, as the read does
    (where a resolver answers anything at all, the connect timeout names it the same way)."""
    r = cli("--region", "tensorstream-nowhere-1", *_BOUNDED, *argv, env=_env(tmp_path))
    assert r.returncode == 1, r.stderr
    assert re.search(r"(cannot connect to|connect timeout to) [a-z0-9.-]+\.amazonaws\.com:443 ",
                     r.stderr), r.stderr
    assert "AWS S3 (EndpointConnectionError)" not in r.stderr
    assert "secret-canary" not in r.stderr
