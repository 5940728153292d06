"""A key, key id or token holding what an HTTP header cannot carry (a control character, a
character beyond ASCII) is refused before a request, without showing it."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
from s3_credential_sources import Sources, everything_said

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.providers.s3.config import resolve_s3_credentials
from tensorstream.testing.s3_server import MotoS3Server


@pytest.mark.parametrize(("env", "options"), [
    ({"AWS_ACCESS_KEY_ID": "AKIACANARY\nX", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}, {}),
    ({"AWS_ACCESS_KEY_ID": "AKIACANARY", "AWS_SECRET_ACCESS_KEY": "s3cr3t\r"}, {}),
    ({"AWS_ACCESS_KEY_ID": "AKIACANARY", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
      "AWS_SESSION_TOKEN": "t\x00k"}, {}),
    ({"S3_ACCESS_KEY_ID": "AKIACANARY\t", "S3_SECRET_ACCESS_KEY": "s3cr3t"}, {}),
    ({}, {"s3_access_key_id": "AKIACANARY\x1b", "s3_secret_access_key": "s3cr3t"}),
])
def test_a_key_with_a_control_character_is_refused_unshown(env: dict[str, str],
                                                            options: dict[str, Any]) -> None:
    """A key pasted with its newline went into botocore's Authorization header, whose
    'Invalid header value' error printed the key id and the signature."""
    with pytest.raises(errors.ConfigurationError, match="control character") as info:
        resolve_s3_credentials(options, env=env)
    text = str(info.value) + "".join(traceback.format_exception(info.value))
    assert "AKIACANARY" not in text and "s3cr3t" not in text


@pytest.mark.parametrize("which", ["s3_session_token", "s3_access_key_id"])
async def test_a_key_id_or_token_beyond_ascii_is_refused_unshown(
        isolated_env: Path, moto_s3_public: MotoS3Server, which: str) -> None:
    # Was http.client's UnicodeEncodeError holding the whole header value: the token,
    # or 'AWS4-HMAC-SHA256 Credential=<key id>/...' with the signature.
    options: dict[str, Any] = {"s3_endpoint": moto_s3_public.endpoint_url, "retries": 1,
                               "s3_access_key_id": "AKIACANARY0123456789",
                               "s3_secret_access_key": "s3cr3t-canary",
                               "s3_session_token": "tok-canary"}
    options[which] += "\u2603"
    with pytest.raises(errors.ConfigurationError, match="not ASCII") as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", **options)
    assert "canary" not in everything_said(info.value).lower()


async def test_a_token_from_a_profile_that_http_cannot_send_is_refused_unshown(
        sources: Sources, moto_s3: MotoS3Server) -> None:
    # botocore's chain is not checked like the variables: http.client's
    # UnicodeEncodeError came out raw, holding the whole token in its args.
    sources.aws_credentials.write_text(
        f"[default]\naws_access_key_id = {moto_s3.access_key_id}\n"
        f"aws_secret_access_key = {moto_s3.secret_access_key}\n"
        "aws_session_token = tok-canary\u2603\n", encoding="utf-8")
    with pytest.raises(errors.ConfigurationError, match="cannot be sent") as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", s3_endpoint=moto_s3.endpoint_url,
                                retries=1)
    assert "canary" not in everything_said(info.value) + repr(info.value.args)
