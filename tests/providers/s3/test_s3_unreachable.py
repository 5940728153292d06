"""An S3 store that cannot be reached is named the same way by every operation: a listing
said ``cannot reach AWS S3 (EndpointConnectionError)`` (no host, no cause) where a read of
the same store said ``cannot connect to b.s3.amazonaws.com:443 (gaierror: ...)``. Each
now names the host and port it tried and why it failed. Every run is bounded: one attempt,
a short connect timeout, and the CLI's own time limit (a resolver that hangs fails the
test, it does not hang it). And an endpoint with user info, which boto3 leaves out, is
left out of writes too (they failed as "cannot reach")."""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from cli_env import cli
from fixtures_s3 import S3_BUCKET
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


async def test_an_endpoint_with_user_info_writes_as_boto3_does(moto_s3: Any) -> None:
    """``http://user:password@host:port``: reads and listings went (the user info unused:
    S3 requests are signed with the key pair), but every write and delete failed with
    ``cannot reach http://user:***@host:port (HTTPClientError)`` (aiohttp will not send
    user info beside the signature's Authorization header). boto3 leaves the user info
    out, and so does tensorstream now."""
    opts = moto_s3.options(retries=1)
    opts["s3_endpoint"] = opts["s3_endpoint"].replace("://", "://u:pw-canary@")
    key = f"userinfo/{uuid.uuid4().hex[:8]}"
    async with tensorstream.get_provider(f"s3://{S3_BUCKET}/{key}", **opts) as provider:
        writer = provider.open_writer(f"{S3_BUCKET}/{key}")
        await writer.write(b"written")
        await writer.commit()
        assert [i.path async for i in provider.list(f"{S3_BUCKET}/userinfo/")] == [
            f"{S3_BUCKET}/{key}"]
        await provider.delete(f"{S3_BUCKET}/{key}")
    assert not moto_s3.exists(S3_BUCKET, key)
