"""Secrets in the query of an HTTP(S) URI given to the CLI (``tensorstream/uri_redaction.py``),
against a real server: never in cp's lines, its errors, ``--json`` or ``--debug`` output."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fixtures_s3 import S3_BUCKET
from tensorstream.cli.main import main
from tensorstream.testing.http_server import HTTPTestServer
from tensorstream.testing.s3_server import MotoS3Server

SECRET = "CANARY-k3y-0f-th3-us3r"


@pytest.fixture(autouse=True)
def _debug_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, third-party ones too


@pytest.mark.parametrize("query", [f"X-Api-Key={SECRET}", f"aws_session_token={SECRET}",
                                   f"API-KEY={SECRET}", f"a=1;sig={SECRET}",
                                   "next=https%3A%2F%2Fh%2Fo%3FX-Amz-Signature%3D" + SECRET,
                                   f"zz9={SECRET}", f"a=1&hmac={SECRET}"])
@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_cp_never_shows_a_secret_query_parameter(
        http_server: HTTPTestServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, query: str, debug: list[str]) -> None:
    """cp printed ``copy: http://h/obj?X-Api-Key=<key> -> ...`` and, for a missing object,
    ``error: http://h/missing?X-Api-Key=<key>: http stat /missing?X-Api-Key=<key>: HTTP 404``
    (in ``--json``'s summary too): only names from a fixed list were redacted."""
    http_server.put("obj", b"x" * 1000)
    assert main([*debug, "cp", f"{http_server.url('obj')}?{query}", str(tmp_path / "o")]) == 0
    assert main([*debug, "cp", "--json", f"{http_server.url('missing')}?{query}",
                 str(tmp_path / "m")]) == 1
    assert main([*debug, "cp", f"{http_server.url('missing')}#access_token={SECRET}",
                 str(tmp_path / "f")]) == 1
    out, err = capsys.readouterr()
    assert (tmp_path / "o").read_bytes() == b"x" * 1000
    assert "404" in err and "copy: http" in out
    assert SECRET not in out + err + caplog.text


def test_an_s3_key_holding_a_presigned_query_is_never_shown(
        moto_s3: MotoS3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``s3://b/obj?X-Amz-Signature=<sig>`` (a presigned URL's query kept after an S3 key: the
    key is all of it) was shown percent-encoded in botocore's DEBUG lines of the request."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.secret_access_key)
    uri = f"s3://{S3_BUCKET}/obj?X-Amz-Signature={SECRET}&x-api-key={SECRET}"
    assert main(["--debug", "--endpoint-url", moto_s3.endpoint_url, "stat", uri]) == 1
    out, err = capsys.readouterr()
    assert "obj%3F" in caplog.text  # botocore's DEBUG lines were seen
    assert SECRET not in out + err + caplog.text
