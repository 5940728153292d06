"""A hostile S3 endpoint echoing the secret key and session token that botocore's
credential chain found (an AWS profile, a ``credential_process``): neither was
given to tensorstream, so only the chain knows them. Writes, deletes and bucket
listings go through the aiobotocore client; only reads and object listings
built the blocking path's, and the secrets were masked only where it had been
built (a delete's error printed the session token)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from s3_credential_sources import everything_said

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.errors import TensorstreamError

pytestmark = pytest.mark.usefixtures("isolated_env")


class Keys:
    """Fresh keys per test: a secret masked once stays masked in this process, so
    reused values would pass for the wrong reason."""

    def __init__(self) -> None:
        self.key_id = "AKIA" + secrets.token_hex(8).upper()
        self.secret = "chainSECRET" + secrets.token_hex(16)
        self.token = "chainTOKEN" + secrets.token_hex(24)


def _echo(keys: Keys) -> Callable[[str, dict[str, str], int], bytes]:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":  # the object is there; reading it is refused
            return (b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: "e"\r\n'
                    b"Connection: close\r\n\r\n")
        sent = headers.get("x-amz-security-token", "")  # what the client sent, echoed
        body = (f'<?xml version="1.0"?><Error><Code>AccessDenied</Code><Message>the key '
                f"{keys.secret} with token {sent} is refused</Message></Error>").encode()
        return (f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode() + body
    return respond


def _profile(tmp: Path, keys: Keys, how: str) -> None:
    """The profile ``chain`` holding ``keys``: in the credentials file, or printed by
    a credential_process."""
    config = tmp / "aws-config"
    if how == "profile":
        shared = tmp / "aws-credentials"
        shared.write_text(f"[chain]\naws_access_key_id = {keys.key_id}\n"
                          f"aws_secret_access_key = {keys.secret}\n"
                          f"aws_session_token = {keys.token}\n")
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(shared)
        config.write_text("[profile chain]\nregion = us-east-1\n")
    else:
        script = tmp / "creds.py"
        script.write_text("print(" + repr(json.dumps({
            "Version": 1, "AccessKeyId": keys.key_id, "SecretAccessKey": keys.secret,
            "SessionToken": keys.token})) + ")\n")
        config.write_text(f"[profile chain]\nregion = us-east-1\n"
                          f"credential_process = {sys.executable} {script}\n")
    os.environ["AWS_CONFIG_FILE"] = str(config)


async def _delete(p: Any) -> None:
    await p.delete("b/k.bin")


async def _write(p: Any) -> None:
    async with p.open_writer("b/k.bin") as w:
        await w.write(b"0123456789")


async def _list_buckets(p: Any) -> None:
    await p.inner.list_buckets()


async def _list(p: Any) -> None:
    async for _ in p.list("b/"):
        pass


async def _read(p: Any) -> None:
    await p.read_range("b/k.bin", 0, 10)


OPS: dict[str, Callable[[Any], Awaitable[None]]] = {
    "delete": _delete, "write": _write, "list buckets": _list_buckets, "list": _list,
    "read": _read}


@pytest.mark.parametrize("how", ["profile", "credential_process"])
@pytest.mark.parametrize("op", list(OPS))
def test_secrets_from_the_chain_echoed_by_the_server_are_masked(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        how: str, op: str) -> None:
    keys = Keys()
    monkeypatch.setenv("AWS_CONFIG_FILE", os.environ["AWS_CONFIG_FILE"])  # (restored after)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.environ["AWS_SHARED_CREDENTIALS_FILE"])
    _profile(isolated_env, keys, how)

    async def go(server: RawHTTPServer) -> None:
        p = tensorstream.get_provider("s3://b/", s3_endpoint=f"http://127.0.0.1:{server.port}",
                                      s3_profile="chain", retries=1)
        try:
            await OPS[op](p)
        finally:
            await p.close()

    caplog.set_level(logging.DEBUG)
    with RawHTTPServer(_echo(keys)) as server, pytest.raises(TensorstreamError) as info:
        asyncio.run(go(server))
    # the server did get the chain's token, and echoed it
    assert any(h.get("x-amz-security-token") == keys.token for _, h in server.requests)
    said = everything_said(info.value)
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    for secret in (keys.secret, keys.token):
        assert secret not in said
        assert secret not in logged
    assert "***" in said
