"""A hostile S3 endpoint that echoes the caller's secret key and session
token back in its error XML (``<Message>``, ``<Code>``): tensorstream's
errors quote the server's message, so the secrets must be masked there,
in the exception, its chain and the CLI's output."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream.cli.main import main
from tensorstream.errors import ConfigurationError, PermissionDeniedError, TensorstreamError

pytestmark = pytest.mark.usefixtures("isolated_env")

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzzSECRETzz"
TOKEN = "FwoGZXIvYXdzEXAMPLEsessionTOKENvalue0123"


def _echo(method: str, headers: dict[str, str], attempt: int) -> bytes:
    body = (f'<?xml version="1.0"?><Error><Code>AccessDenied{SECRET}</Code><Message>the key '
            f'{SECRET} with token {TOKEN} is refused</Message></Error>').encode()
    if method == "HEAD":  # the object is there; reading it is refused
        return b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: "e"\r\nConnection: close\r\n\r\n'
    head = f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def _options(server: RawHTTPServer) -> dict[str, object]:
    return {"s3_endpoint": f"http://127.0.0.1:{server.port}", "s3_access_key_id": "AKIAEXAMPLE",
            "s3_secret_access_key": SECRET, "s3_session_token": TOKEN,
            "s3_region": "us-east-1", "retries": 1}


def _shown(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


def _assert_masked(text: str) -> None:
    assert SECRET not in text and TOKEN not in text
    assert "***" in text


def test_a_listing_refusal_that_echoes_the_secrets_masks_them() -> None:
    async def go() -> None:
        with RawHTTPServer(_echo) as server:
            provider = tensorstream.get_provider("s3://b/", **_options(server))
            try:
                async for _ in provider.list("b/"):
                    pass
            finally:
                await provider.close()
    with pytest.raises(PermissionDeniedError) as info:
        asyncio.run(go())
    _assert_masked(_shown(info.value))


def test_a_read_refusal_that_echoes_the_secrets_masks_them() -> None:
    with RawHTTPServer(_echo) as server, pytest.raises(TensorstreamError) as info:
        with tensorstream.open("s3://b/k.bin", **_options(server)) as f:
            f.read()
    _assert_masked(_shown(info.value))


def test_ls_refused_with_the_secrets_echoed_prints_them_masked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with RawHTTPServer(_echo) as server:
        code = main(["ls", "s3://b/", "--endpoint-url", f"http://127.0.0.1:{server.port}"])
    out, err = capsys.readouterr()
    assert code != 0
    _assert_masked(out + err)


def test_a_botocore_refusal_that_echoes_the_secrets_masks_them_in_the_chain() -> None:
    # delete goes through botocore: its ClientError stays the cause of ours.
    async def go() -> None:
        with RawHTTPServer(_echo) as server:
            provider = tensorstream.get_provider("s3://b/", **_options(server))
            try:
                await provider.delete("b/k.bin")
            finally:
                await provider.close()
    with pytest.raises(PermissionDeniedError) as info:
        asyncio.run(go())
    assert info.value.__cause__ is not None  # the chain is kept, masked
    _assert_masked(_shown(info.value))


def _bare_400_on_head(code: str, message: str) -> Any:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        if method == "HEAD":  # S3 gives a HEAD's error no body
            return b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
        return (f"HTTP/1.1 400 Bad Request\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode() + body
    return respond


@pytest.mark.parametrize("sequential", [False, True])
def test_an_expired_session_token_names_the_source_of_the_keys_not_a_bare_400(
        sequential: bool) -> None:
    """S3 answers a HEAD with an expired token with a bare 400: the error said
    "S3 rejected the request (400)". A GET of byte 0 gets its reason."""
    respond = _bare_400_on_head("ExpiredToken", "The provided token has expired.")
    with RawHTTPServer(respond) as server, pytest.raises(PermissionDeniedError) as info:
        tensorstream.open("s3://b/k.bin", sequential=sequential, **_options(server)).read()
    assert "ExpiredToken" in str(info.value)
    assert "option s3_access_key_id/s3_secret_access_key" in str(info.value)
    _assert_masked(_shown(info.value) + "***")


def test_an_sse_c_object_read_without_its_key_says_so_not_a_bare_400() -> None:
    respond = _bare_400_on_head(
        "InvalidRequest", "The object was stored using a form of Server Side Encryption. "
        "The correct parameters must be provided to retrieve the object.")
    with RawHTTPServer(respond) as server, pytest.raises(ConfigurationError,
                                                         match="Server Side Encryption"):
        tensorstream.open("s3://b/k.bin", **_options(server)).read()


@pytest.mark.parametrize("pad", [0, 9, 18, 27])
def test_a_long_echo_cut_for_the_chain_leaves_no_part_of_a_secret(pad: int) -> None:
    """A third-party error in the chain is cut to 2,000 characters, and was cut before its
    secrets were masked: a secret the cut fell inside no longer matched, and its first
    characters were shown. Here aiohttp quotes the body a HEAD was answered with (a HEAD
    has none), echoing the secret 80 times. It is masked first, then cut."""
    message = "p" * pad + " ".join([SECRET] * 80)

    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        body = f"<Error><Code>AccessDenied</Code><Message>{message}</Message></Error>".encode()
        return (f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode() + body

    async def go() -> None:
        with RawHTTPServer(respond) as server:
            provider = tensorstream.get_provider("s3://b/", **_options(server))
            try:
                await provider.delete("b/k.bin")  # (aiobotocore: aiohttp reads the HEAD)
            finally:
                await provider.close()
    with pytest.raises(TensorstreamError) as info:
        asyncio.run(go())
    shown = _shown(info.value)
    assert "Data after" in shown  # aiohttp's complaint, quoting the body, is in the chain
    assert SECRET[:3] not in shown
