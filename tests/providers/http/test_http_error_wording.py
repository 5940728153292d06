"""What HTTP(S) errors say. Listing, writing or deleting over HTTP(S) ended with
``http does not support list (its capabilities do not declare list)``, the provider's
internals; it now says in user words that HTTP(S) servers cannot do it through
tensorstream, and what to use instead (still an ``UnsupportedOperationError``: code may
catch it). An HTTP error named only the path (``http stat /k: HTTP 404 ...``): it names
the server's host:port too, never user info or a query string (either may hold a
secret)."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

import tensorstream
from cli_env import cli
from tensorstream import errors
from tensorstream.testing.http_server import HTTPTestServer


async def _provider_error(url: str, operation: str) -> errors.TensorstreamError:
    async with tensorstream.get_provider(url) as provider:
        path = url.split("127.0.0.1", 1)[1].partition("/")[2]
        with pytest.raises(errors.UnsupportedOperationError) as info:
            if operation == "list":
                async for _ in provider.list("/" + path):
                    pass
            elif operation == "write":
                provider.open_writer("/" + path)
            else:
                await provider.delete("/" + path)
    return info.value


@pytest.mark.parametrize(("operation", "instead"), [
    ("list", "name each object by its URL"), ("write", "write to S3"),
    ("delete", "delete it on the server")])
async def test_an_operation_http_has_not_says_so_in_user_words(
        http_server: HTTPTestServer, operation: str, instead: str) -> None:
    error = await _provider_error(http_server.url("d/k.bin"), operation)
    text = str(error)
    assert "capabilities" not in text and "declare" not in text, text
    verb = {"list": "be listed", "write": "be written to", "delete": "delete"}[operation]
    assert f"HTTP(S) servers cannot {verb} through tensorstream" in text, text
    assert instead in text, text
    assert type(error) is errors.UnsupportedOperationError  # (the class code catches)


@pytest.mark.parametrize("argv", [["ls", "{base}/d/"], ["rm", "{base}/k.bin"],
                                  ["cp", "{src}", "{base}/k.bin"]], ids=["ls", "rm", "cp"])
def test_the_cli_says_it_in_user_words_too(
        http_server: HTTPTestServer, tmp_path: Path, argv: list[str]) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    r = cli(*[a.format(base=http_server.base_url, src=src) for a in argv])
    assert r.returncode != 0
    assert "HTTP(S) servers cannot" in r.stderr and "capabilities" not in r.stderr, r.stderr


async def test_an_http_error_names_the_server_never_its_user_info_or_query(
        http_server: HTTPTestServer) -> None:
    key = f"missing-{uuid.uuid4().hex[:8]}.bin"
    url = f"http://u:pw-canary@127.0.0.1:{http_server.port}/{key}?token=tok-canary&v=q-canary"
    with pytest.raises(errors.NotFoundError) as info:
        await tensorstream.read_range(url, 0, 10, retries=1)
    text = str(info.value)
    assert f"127.0.0.1:{http_server.port}/{key}" in text, text
    assert "pw-canary" not in text and "tok-canary" not in text and "u:" not in text, text
    assert text.startswith(f"http read 127.0.0.1:{http_server.port}/{key}?"), text


async def test_a_server_nobody_answers_names_its_address_and_cause() -> None:
    """The neighbour: an error that named the address already (a refused connection)
    still says it and why."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(errors.ConnectionFailedError) as info:
        await tensorstream.read_range(f"http://127.0.0.1:{port}/k", 0, 10, retries=1)
    assert f"cannot connect to 127.0.0.1:{port} (ConnectionRefusedError" in str(info.value)


@pytest.mark.parametrize("exc", [TimeoutError("timed out"),
                                 __import__("asyncio").TimeoutError()])
def test_a_transport_timeout_is_a_storage_timeout(exc: BaseException) -> None:
    # Before Python 3.11 asyncio.TimeoutError is not a TimeoutError: it became an
    # unclassified error (not retried as a timeout, no timeout advice) on 3.10.
    from tensorstream.providers._http.status_errors import exception_error

    err = exception_error(exc, path="/m.bin", received=5)
    assert isinstance(err, errors.StorageTimeoutError) and err.temporary
    assert "timed out after 5 bytes" in str(err)
