"""Keys travel only to the endpoint configured with them: ~/.s3cfg's ``host_base``
goes with ~/.s3cfg's keys (as s3cmd and tensorizer pair them), never with keys from the
AWS variables, the ~/.aws files or botocore's chain (boto3 never reads ~/.s3cfg); and
~/.s3cfg's keys go to its ``host_base``, not to the AWS SDK's ``AWS_ENDPOINT_URL``.

The "other store" is a recording HTTP proxy in front of moto: every request that reached
it is kept with its ``Authorization`` header, so a test sees which key signed what.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream.providers.s3.config import resolve_s3_credentials
from tensorstream.testing.proxy import HTTPFaultProxy
from tensorstream.testing.s3_server import MotoS3Server

URI = f"s3://{S3_BUCKET}/paired"
DATA = b"keys go where they were configured"
AWS_KEY = "AKIAENVIRONMENTKEY00"
CFG_KEY = "AKIAS3CMDCONFIGKEY00"


@pytest.fixture
def other_store(moto_s3: MotoS3Server) -> Iterator[HTTPFaultProxy]:
    """The store ~/.s3cfg (or a variable) points at: it records who signed each request."""
    moto_s3.put(S3_BUCKET, "paired", DATA)
    with HTTPFaultProxy(moto_s3.endpoint_url) as proxy:
        yield proxy


def _signers(proxy: HTTPFaultProxy) -> set[str]:
    """The access key ids that signed the requests the proxy saw ('' for unsigned)."""
    found = set()
    for request in proxy.requests:
        auth = request.headers.get("Authorization", "")
        found.add(auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth
                  else "")
    return found


def _s3cfg(home: Path, host: str, key: str | None = None, secret: str | None = None) -> Path:
    path = home / ".s3cfg"
    keys = f"access_key = {key}\nsecret_key = {secret}\n" if key else ""
    path.write_text(f"[default]\n{keys}host_base = {host}\nhost_bucket = {host}\n"
                    "use_https = False\n")
    return path


def _host(url: str) -> str:
    return url.split("://", 1)[1]


async def test_aws_variables_keys_are_not_sent_to_the_s3cmd_files_endpoint(
        isolated_env: Path, moto_s3: MotoS3Server, other_store: HTTPFaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and a ~/.s3cfg for another store: the
    AWS keys were signed for and sent to ~/.s3cfg's host_base. Now they go where boto3
    sends them (here the AWS config file's endpoint_url)."""
    _s3cfg(isolated_env / "home", _host(other_store.url), CFG_KEY, "cfg-secret")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.secret_access_key)
    config = isolated_env / "aws-config"
    config.write_text(f"[default]\nendpoint_url = {moto_s3.endpoint_url}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert await tensorstream.read_range(URI, 0, len(DATA)) == DATA
    assert other_store.requests == []
    report = tensorstream.describe_credentials(URI)
    assert report.source_of("endpoint") == f"{config} [profile default] endpoint_url"
    # no endpoint configured for them: AWS's, as boto3 (never the s3cmd file's)
    config.write_text("")
    assert resolve_s3_credentials({}).endpoint is None


async def test_aws_file_keys_are_not_sent_to_the_s3cmd_files_endpoint(
        isolated_env: Path, moto_s3: MotoS3Server, other_store: HTTPFaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ~/.s3cfg with only host_base and the default profile's keys (no profile named):
    the profile's keys went to ~/.s3cfg's host_base."""
    _s3cfg(isolated_env / "home", _host(other_store.url))
    credentials, config = isolated_env / "aws-credentials", isolated_env / "aws-config"
    credentials.write_text(f"[default]\naws_access_key_id = {moto_s3.access_key_id}\n"
                           f"aws_secret_access_key = {moto_s3.secret_access_key}\n")
    config.write_text(f"[default]\nendpoint_url = {moto_s3.endpoint_url}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert await tensorstream.read_range(URI, 0, len(DATA)) == DATA
    assert other_store.requests == []


async def test_s3cmd_keys_go_to_its_host_base_not_to_aws_endpoint_url(
        isolated_env: Path, moto_s3: MotoS3Server, other_store: HTTPFaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """~/.s3cfg's keys and host_base, AWS_ENDPOINT_URL set for the AWS SDK: the s3cmd
    keys were sent to AWS_ENDPOINT_URL. Now to host_base, as s3cmd and tensorizer do."""
    cfg = _s3cfg(isolated_env / "home", _host(moto_s3.endpoint_url), moto_s3.access_key_id,
                 moto_s3.secret_access_key)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(name, other_store.url)
    assert await tensorstream.read_range(URI, 0, len(DATA)) == DATA
    assert other_store.requests == []
    report = tensorstream.describe_credentials(URI)
    assert report.source_of("endpoint") == f"s3cmd config {cfg} host_base"
    assert report.source_of("access_key_id") == f"s3cmd config {cfg}"


async def test_explicit_endpoints_still_take_the_s3cmd_keys(
        isolated_env: Path, moto_s3: MotoS3Server, other_store: HTTPFaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The option s3_endpoint and vLLM's S3_ENDPOINT_URL are the user's choice for this
    read (tensorizer signs with ~/.s3cfg's keys for them): they beat host_base."""
    _s3cfg(isolated_env / "home", "127.0.0.1:1", moto_s3.access_key_id,
           moto_s3.secret_access_key)
    assert await tensorstream.read_range(URI, 0, 4, s3_endpoint=other_store.url) == DATA[:4]
    monkeypatch.setenv("S3_ENDPOINT_URL", other_store.url)
    assert await tensorstream.read_range(URI, 0, 4) == DATA[:4]
    assert _signers(other_store) == {moto_s3.access_key_id}


def test_an_s3cmd_file_named_by_option_lends_its_endpoint_only_without_keys(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3_config_path naming a file with no keys chooses its endpoint for any keys; one
    with keys of its own keeps its endpoint for them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    bare = _s3cfg(isolated_env, "store.example")
    creds = resolve_s3_credentials({"s3_config_path": str(bare)})
    assert creds.endpoint is not None and creds.endpoint.source == f"s3cmd config {bare} host_base"
    keyed = _s3cfg(isolated_env, "store.example", CFG_KEY, "cfg-secret")
    creds = resolve_s3_credentials({"s3_config_path": str(keyed)})
    assert creds.key_source == "env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
    assert creds.endpoint is None
