"""Where the S3 credential tests put a key pair: ``Sources`` puts one (and the endpoint) at one
level of the precedence order (``LEVELS``), good or bad; ``SOURCE`` is what an error or
describe_credentials names for each level. The ``sources`` fixture is in conftest.py."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from tensorstream.testing.s3_server import MotoS3Server

BAD_KEY = "AKIAWRONGWRONGWRONG0"
BAD_SECRET = "canary-BAD-secret-0123456789abcdef"
LEVELS = ["options", "s3_env", "aws_env", "s3cfg", "aws_profile"]
#: What describe_credentials / error messages name for a key pair from each level.
SOURCE = {
    "options": "option s3_access_key_id/s3_secret_access_key",
    "s3_env": "env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY",
    "aws_env": "env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
    "s3cfg": "s3cmd config",
    "aws_profile": "[profile default]",
}


class Sources:
    """Puts a key pair (and endpoint) at one level of the precedence order."""

    def __init__(self, home: Path, monkeypatch: pytest.MonkeyPatch, server: MotoS3Server) -> None:
        self.home = home
        self.mp = monkeypatch
        self.server = server
        self.options: dict[str, Any] = {}
        self.aws_credentials = home / "aws-credentials"
        self.aws_config = home / "aws-config"
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(self.aws_credentials))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(self.aws_config))
        self.aws_config.write_text("")

    def put(self, level: str, key: str, secret: str, endpoint: str) -> None:
        if level == "options":
            self.options.update(s3_access_key_id=key, s3_secret_access_key=secret,
                                s3_endpoint=endpoint)
        elif level == "s3_env":
            self.mp.setenv("S3_ACCESS_KEY_ID", key)
            self.mp.setenv("S3_SECRET_ACCESS_KEY", secret)
            self.mp.setenv("S3_ENDPOINT_URL", endpoint)
        elif level == "aws_env":
            self.mp.setenv("AWS_ACCESS_KEY_ID", key)
            self.mp.setenv("AWS_SECRET_ACCESS_KEY", secret)
            self.mp.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        elif level == "s3cfg":
            host = endpoint.split("://", 1)[1]
            (self.home / ".s3cfg").write_text(
                f"[default]\naccess_key = {key}\nsecret_key = {secret}\n"
                f"host_base = {host}\nhost_bucket = {host}\nuse_https = False\n"
            )
        elif level == "aws_profile":
            self.aws_credentials.write_text(
                f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
            )
            self.aws_config.write_text(f"[default]\nendpoint_url = {endpoint}\n")
        else:  # pragma: no cover
            raise AssertionError(level)

    def good(self, level: str) -> None:
        s = self.server
        self.put(level, s.access_key_id, s.secret_access_key, s.endpoint_url)

    def bad(self, level: str) -> None:
        self.put(level, BAD_KEY, BAD_SECRET, self.server.endpoint_url)


def everything_said(exc: BaseException) -> str:
    """Every message, attribute and traceback line of ``exc`` and its whole chain."""
    parts = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        parts += [repr(node), str(node), repr(vars(node)) if hasattr(node, "__dict__") else ""]
        node = node.__cause__ or node.__context__
    return "\n".join(parts)
