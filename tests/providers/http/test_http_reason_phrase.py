"""An HTTP(S) answer's reason phrase is the server's text in tensorstream's
error: a server that echoes what it was sent there (a presigned URL's
signature, alone) must not put the secret in the error, and one that sends
kilobytes of it must not make the error kilobytes long."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tensorstream
from reliability_helpers import RawHTTPServer
from tensorstream import errors

pytestmark = pytest.mark.usefixtures("isolated_env")

SIG = "f00dfeedcafe0123456789abcdef"
Respond = Callable[[str, dict[str, str], int], bytes]


def _status(status: int, reason: str) -> Respond:
    def respond(method: str, headers: dict[str, str], attempt: int) -> bytes:
        return (f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                ).encode("latin-1")
    return respond


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


@pytest.mark.parametrize(("status", "raised"), [
    (404, errors.NotFoundError), (403, errors.PermissionDeniedError),
    (400, errors.ConfigurationError), (503, errors.RetriesExhaustedError),
])
@pytest.mark.parametrize("name", ["X-Amz-Signature", "hmac", "zz9"])
def test_a_reason_phrase_echoing_a_presigned_signature_never_shows_it(
        status: int, raised: type[Exception], name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # "HTTP 404 signature f00d... not found" was shown whole: the signature's value
    # is masked where it follows its name (X-Amz-Signature=***), not alone. A token
    # under any name (?hmac=, ?zz9=) is a secret too: it was shown.
    from tensorstream import _log_redaction
    monkeypatch.setattr(_log_redaction, "_PER_REQUEST", {})  # (not remembered by another test)
    with RawHTTPServer(_status(status, f"signature {SIG} not valid")) as server:
        url = server.url("m.bin") + f"?{name}={SIG}&X-Amz-Expires=60"
        with pytest.raises(raised) as info:
            with tensorstream.open(url, retries=2, backoff_max=0.01) as f:
                f.read()
    for exc in _chain(info.value):
        assert SIG not in str(exc) and SIG not in repr(exc), repr(exc)
        for arg in exc.args:
            assert SIG not in str(arg)
    assert f"HTTP {status}" in str(info.value)


def test_cat_of_a_reason_phrase_echoing_the_signature_never_prints_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(tensorstream.__file__).parents[1]), os.environ.get("PYTHONPATH"))
        if p)}
    with RawHTTPServer(_status(404, f"signature {SIG} not valid")) as server:
        url = server.url("m.bin") + f"?X-Amz-Signature={SIG}"
        run = subprocess.run([sys.executable, "-m", "tensorstream", "--debug", "cat", url],
                             capture_output=True, timeout=120, env=env)
    assert run.returncode != 0
    assert b"HTTP 404" in run.stderr
    assert SIG.encode() not in run.stderr + run.stdout


@pytest.mark.parametrize("status", [404, 500])
def test_a_reason_phrase_of_kilobytes_is_cut_in_the_error(status: int) -> None:
    with RawHTTPServer(_status(status, "x" * 60000)) as server:
        with pytest.raises(errors.TensorstreamError) as info:
            with tensorstream.open(server.url("m.bin"), retries=1) as f:
                f.read()
    for exc in _chain(info.value):
        assert len(str(exc)) < 1000, len(str(exc))
    assert "60000 characters" in str(info.value)


@pytest.mark.parametrize("echoed", ["signature", "token"])
def test_a_retried_answer_echoing_a_secret_never_shows_it_in_the_debug_log(
        echoed: str, caplog: pytest.LogCaptureFixture) -> None:
    # The retry layer's "attempt 1 failed (...)" line quoted the error unmasked:
    # "HTTP 503 busy <the token>" with --debug, though the error itself was masked.
    token = "t0ken-b3arer-9f8e7d6c5b4a"
    secret = SIG if echoed == "signature" else token
    caplog.set_level("DEBUG", "tensorstream")
    with RawHTTPServer(_status(503, f"busy {secret}")) as server:
        url = server.url("m.bin") + f"?X-Amz-Signature={SIG}"
        with pytest.raises(errors.RetriesExhaustedError) as info:
            with tensorstream.open(url, token=token, retries=2, backoff_max=0.01) as f:
                f.read()
    assert "attempt 1 failed" in caplog.text
    assert secret not in caplog.text
    assert secret not in str(info.value)


@pytest.mark.parametrize("name", ["X-Amz-Signature", "hmac"])
def test_a_reason_phrase_behind_a_redirect_echoing_its_signature_never_shows_it(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A URL redirected to a presigned one (as model hubs send a download to their store):
    the signature was only in the redirect's Location, never remembered, and the store's
    reason phrase echoing it alone was shown whole in the error."""
    from tensorstream import _log_redaction
    monkeypatch.setattr(_log_redaction, "_PER_REQUEST", {})  # (not remembered by another test)
    with RawHTTPServer(_status(403, f"signature {SIG} not valid")) as store:
        target = store.url("m.bin") + f"?{name}={SIG}&X-Amz-Expires=60"

        def redirect(method: str, headers: dict[str, str], attempt: int) -> bytes:
            return (f"HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n").encode()

        with RawHTTPServer(redirect) as hub:
            with pytest.raises(errors.PermissionDeniedError) as info:
                with tensorstream.open(hub.url("m.bin"), retries=1) as f:
                    f.read()
    for exc in _chain(info.value):
        assert SIG not in str(exc) and SIG not in repr(exc), repr(exc)
    assert "HTTP 403" in str(info.value)
