"""What botocore's chain cannot use is one clear ConfigurationError (or a connection error)
without a secret: an AWS config it cannot parse, a credential refresh that fails, an SSO
profile without a token, a role profile whose STS is unreachable or has no region."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from s3_credential_sources import BAD_SECRET, Sources, everything_said

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.testing.s3_server import MotoS3Server

#: AWS config files a credential chain cannot use, each holding a canary secret.
BROKEN_AWS_CONFIG = {
    "credentials file that is not INI": (
        "credentials", f"this is not ini [[[\nsecret = {BAD_SECRET}\n", "Unable to parse"),
    "credentials file that is not UTF-8": (
        "credentials", f"[default]\naws_access_key_id = \udcff{BAD_SECRET}\n", "Unable to parse"),
    "credential_process that fails": (
        "config", f"[default]\ncredential_process = /bin/sh -c 'echo {BAD_SECRET} >&2; exit 3'\n",
        "custom-process"),
    "credential_process that prints no JSON": (
        "config", f"[default]\ncredential_process = /bin/echo {BAD_SECRET}\n", "withheld"),
    "source_profile that loops": (
        "config", "[default]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = a\n"
        "[profile a]\nrole_arn = arn:aws:iam::1:role/y\nsource_profile = default\n",
        "Infinite loop"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_AWS_CONFIG))
async def test_an_aws_config_botocore_cannot_use_is_a_configuration_error_without_secrets(
        sources: Sources, moto_s3: MotoS3Server, case: str) -> None:
    which, text, said = BROKEN_AWS_CONFIG[case]
    target = sources.aws_credentials if which == "credentials" else sources.aws_config
    target.write_bytes(text.encode("utf-8", "surrogateescape"))
    uri = f"s3://{S3_BUCKET}/x"
    attempts = [
        lambda: tensorstream.open(uri, s3_endpoint=moto_s3.endpoint_url, retries=1),
        lambda: tensorstream.describe_credentials(uri, s3_endpoint=moto_s3.endpoint_url),
    ]
    for attempt in attempts:
        with pytest.raises(errors.ConfigurationError) as info:
            attempt()
        assert said in str(info.value) and "profile 'default'" in str(info.value)
        assert BAD_SECRET not in everything_said(info.value)
    with pytest.raises(errors.ConfigurationError) as info:
        await tensorstream.stat(uri, s3_endpoint=moto_s3.endpoint_url, retries=1)
    assert BAD_SECRET not in everything_said(info.value)


async def test_a_credential_refresh_that_fails_is_a_configuration_error_without_secrets(
        sources: Sources, moto_s3: MotoS3Server, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # Was botocore's CredentialRetrievalError, raw (no path, exit status 1), quoting
    # what the credential_process printed, on every path (stat, list, cp); and
    # botocore.credentials' WARNING about it carried the same text in its traceback.
    # The first run's keys expire inside botocore's refresh window; the second run fails.
    ran = tmp_path / "ran"
    expiry = (datetime.now(timezone.utc) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    keys = json.dumps({"Version": 1, "AccessKeyId": moto_s3.access_key_id,
                       "SecretAccessKey": moto_s3.secret_access_key, "Expiration": expiry})
    script = tmp_path / "credentials.sh"
    script.write_text(f"#!/bin/sh\nif [ -e {ran} ]; then echo {BAD_SECRET} >&2; exit 3; fi\n"
                      f"touch {ran}\necho '{keys}'\n")
    script.chmod(0o755)
    sources.aws_config.write_text(f"[default]\ncredential_process = {script}\n")
    caplog.set_level(logging.DEBUG)
    uri = f"s3://{S3_BUCKET}/"

    async def listing() -> None:
        async with tensorstream.get_provider(uri, s3_endpoint=moto_s3.endpoint_url,
                                             retries=1) as provider:
            [_ async for _ in provider.list(S3_BUCKET + "/")]

    for attempt in (lambda: tensorstream.stat(uri + "x", s3_endpoint=moto_s3.endpoint_url,
                                              retries=1), listing):
        ran.unlink(missing_ok=True)
        with pytest.raises(errors.ConfigurationError, match="'custom-process' failed") as info:
            await attempt()
        assert BAD_SECRET not in everything_said(info.value)
    assert "CredentialRetrievalError: (message withheld" in caplog.text  # traceback kept
    assert BAD_SECRET not in caplog.text


async def test_a_credential_process_whose_keys_have_expired_says_so_and_where(
        sources: Sources, moto_s3: MotoS3Server, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # botocore refreshes them at once, gets them expired again and raises a bare
    # RuntimeError: reads and listings said "botocore's credential chain failed
    # (RuntimeError; ... run it by hand)", describe_credentials raised it raw.
    expired = (datetime.now(timezone.utc) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    keys = json.dumps({"Version": 1, "AccessKeyId": moto_s3.access_key_id,
                       "SecretAccessKey": BAD_SECRET, "SessionToken": BAD_SECRET + "-token",
                       "Expiration": expired})
    script = tmp_path / "credentials.sh"
    script.write_text(f"#!/bin/sh\necho '{keys}'\n")
    script.chmod(0o755)
    sources.aws_config.write_text(f"[profile ci]\ncredential_process = {script}\n")
    caplog.set_level(logging.DEBUG)
    for attempt in _front_doors(moto_s3, "ci"):
        with pytest.raises(errors.ConfigurationError) as info:
            await attempt()
        said = str(info.value)
        assert "Expiration is already past" in said, said
        assert f"{sources.aws_config} [profile ci] credential_process" in said
        assert BAD_SECRET not in everything_said(info.value)
    assert BAD_SECRET not in caplog.text


@pytest.mark.parametrize("expiration", ["never", "1765152000", "2026-12-07 23:59"])
async def test_a_credential_process_whose_expiration_is_no_time_says_so_and_where(
        sources: Sources, moto_s3: MotoS3Server, tmp_path: Path, expiration: str) -> None:
    # Was "botocore's credential chain failed (ParserError / TypeError (a time without its
    # zone); ... run it by hand)", naming neither the process nor its Expiration.
    keys = json.dumps({"Version": 1, "AccessKeyId": moto_s3.access_key_id,
                       "SecretAccessKey": BAD_SECRET, "Expiration": expiration})
    script = tmp_path / "credentials.sh"
    script.write_text(f"#!/bin/sh\necho '{keys}'\n")
    script.chmod(0o755)
    sources.aws_config.write_text(f"[profile ci]\ncredential_process = {script}\n")
    for attempt in _front_doors(moto_s3, "ci"):
        with pytest.raises(errors.ConfigurationError) as info:
            await attempt()
        said = str(info.value)
        assert f"{sources.aws_config} [profile ci] credential_process" in said, said
        assert "returned an Expiration that is not a time with its zone" in said
        assert BAD_SECRET not in everything_said(info.value)


async def test_a_role_whose_credential_source_has_no_keys_says_which_and_what_to_set(
        sources: Sources, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # Was "its credential source 'Environment' failed (CredentialRetrievalError; what it
    # printed is withheld ...: run it by hand to see why)": nothing runs, nothing printed.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    sources.aws_config.write_text("[profile ci]\nrole_arn = arn:aws:iam::123456789012:role/r\n"
                                  "credential_source = Environment\n")
    uri = f"s3://{S3_BUCKET}/x"
    opts = {"s3_endpoint": moto_s3.endpoint_url, "s3_profile": "ci"}

    async def read() -> None:
        tensorstream.open(uri, retries=1, **opts).read()

    async def describe() -> None:
        tensorstream.describe_credentials(uri, **opts)

    for attempt in (read, describe):
        with pytest.raises(errors.ConfigurationError) as info:
            await attempt()
        said = str(info.value)
        assert f"{sources.aws_config} [profile ci] credential_source = Environment found no " \
               "keys" in said, said
        assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in said
        assert "run it by hand" not in said and info.value.__cause__ is not None


async def test_an_sso_profile_without_a_token_says_to_log_in(sources: Sources,
                                                             moto_s3: MotoS3Server) -> None:
    # Was botocore's SSOTokenLoadError, raw: no path, no profile, exit status 1.
    sources.aws_config.write_text("[profile work]\nsso_start_url = https://sso.invalid/start\n"
                                  "sso_region = us-east-1\nsso_account_id = 1\n"
                                  "sso_role_name = r\n")
    with pytest.raises(errors.ConfigurationError, match="aws sso login --profile work") as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", s3_endpoint=moto_s3.endpoint_url,
                                s3_profile="work", retries=1)
    assert "profile 'work'" in str(info.value)


def test_a_role_profile_whose_sts_cannot_be_reached_fails_once_naming_it(
        isolated_env: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile with role_arn/source_profile where STS does not answer: one clear
    error naming the profile and the endpoint (before: 'cannot reach  ', retried
    5 times over botocore's own STS retries, 41 s without network)."""
    import socket
    import time

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        sts = f"http://127.0.0.1:{closed.getsockname()[1]}"
    config = isolated_env / "role-config"
    config.write_text(
        "[profile src]\naws_access_key_id = AKIAEXAMPLEEXAMPLE12\n"
        "aws_secret_access_key = secret\n"
        "[profile role]\nrole_arn = arn:aws:iam::123456789012:role/r\n"
        "source_profile = src\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts)
    options = {"s3_endpoint": moto_s3.endpoint_url, "s3_region": "us-east-1",
               "s3_profile": "role", "backoff_initial": 0.01}
    started = time.monotonic()
    with pytest.raises(errors.ConnectionFailedError) as info:
        tensorstream.open(f"s3://{S3_BUCKET}/k", **options).read()
    assert not isinstance(info.value, errors.RetriesExhaustedError)
    assert "profile 'role'" in str(info.value) and f"cannot reach {sts}" in str(info.value)
    assert time.monotonic() - started < 30


def test_a_role_profile_without_a_region_for_sts_says_to_set_one(
        isolated_env: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    config = isolated_env / "role-config"
    config.write_text(
        "[profile src]\naws_access_key_id = AKIAEXAMPLEEXAMPLE12\n"
        "aws_secret_access_key = secret\n"
        "[profile role]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = src\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")
    with pytest.raises(errors.ConfigurationError, match=r"needs a region .*set region in the "
                                                        r"profile"):
        tensorstream.open(f"s3://{S3_BUCKET}/k", s3_endpoint=moto_s3.endpoint_url,
                          s3_region="us-east-1", s3_profile="role").read()


@pytest.mark.parametrize("variable", ["AWS_PROFILE", "AWS_DEFAULT_PROFILE"])
async def test_a_profile_variable_set_but_empty_says_to_unset_it(
        sources: Sources, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch,
        variable: str) -> None:
    # botocore (boto3, the aws CLI) takes AWS_PROFILE= for a profile named '': it was
    # "AWS profile '' (env AWS_PROFILE) is not defined in ...".
    sources.good("aws_profile")
    monkeypatch.setenv(variable, "")
    uri = f"s3://{S3_BUCKET}/x"
    for attempt in (lambda: tensorstream.stat(uri, s3_endpoint=moto_s3.endpoint_url, retries=1),
                    lambda: _describe(uri, moto_s3)):
        with pytest.raises(errors.ConfigurationError) as info:
            await attempt()
        assert f"env {variable} is set but empty" in str(info.value), str(info.value)
        assert f"unset {variable}" in str(info.value)


async def _describe(uri: str, moto_s3: MotoS3Server) -> object:
    return tensorstream.describe_credentials(uri, s3_endpoint=moto_s3.endpoint_url)


def _front_doors(moto_s3: MotoS3Server, profile: str) -> tuple[Callable[[], Awaitable[None]], ...]:
    """A read, a listing and ``describe_credentials`` of an object on ``moto_s3`` with
    ``profile``: each finds its keys its own way (the blocking data plane's signing
    client, aiobotocore's, botocore's chain run synchronously)."""
    uri = f"s3://{S3_BUCKET}/x"
    opts = {"s3_endpoint": moto_s3.endpoint_url, "s3_profile": profile}

    async def listing() -> None:
        async with tensorstream.get_provider(uri, retries=1, **opts) as provider:
            [_ async for _ in provider.list(S3_BUCKET + "/")]

    async def read() -> None:
        tensorstream.open(uri, retries=1, **opts).read()

    async def describe() -> None:
        tensorstream.describe_credentials(uri, **opts)

    return read, listing, describe
