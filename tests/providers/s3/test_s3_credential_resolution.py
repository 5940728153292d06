"""S3 settings resolved without a request: describe_credentials (sources shown, secrets
masked), the precedence of endpoint, region and token, an explicit s3cfg path, and endpoints
botocore cannot use refused naming their source (one without a scheme where botocore's
own settings give it; tensorizer's take it as https://)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from s3_credential_sources import SOURCE, Sources

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.providers.s3.config import resolve_s3_credentials


def test_describe_credentials_shows_sources_and_masks_secrets(sources: Sources) -> None:
    sources.good("s3_env")
    sources.mp.setenv("AWS_REGION", "eu-west-3")
    report = tensorstream.describe_credentials(
        f"s3://{S3_BUCKET}/model.tensors", s3_addressing_style="virtual"
    )
    text = str(report)
    assert sources.server.secret_access_key not in text
    assert sources.server.access_key_id not in text and sources.server.access_key_id[-4:] in text
    assert report.source_of("secret_access_key") == SOURCE["s3_env"]
    assert report.source_of("endpoint") == "env S3_ENDPOINT_URL"
    assert report.source_of("region") == "env AWS_REGION"
    assert report.source_of("addressing_style") == "option s3_addressing_style"
    assert report.as_dict()["secret_access_key"]["value"] == "***"
    assert sources.server.secret_access_key not in repr(report) + repr(report.as_dict())


def test_describe_credentials_for_other_schemes_masks_secrets(isolated_env: Path) -> None:
    report = tensorstream.describe_credentials(
        "redis://user:canary-pw@localhost:6379/k", redis_password="canary-opt"
    )
    text = str(report) + repr(report.as_dict())
    assert "canary-pw" not in text and "canary-opt" not in text
    assert report.source_of("password") == "option redis_password"
    assert report.source_of("username") == "URI userinfo"
    http = tensorstream.describe_credentials("https://host/x", token="canary-token")
    assert "canary-token" not in str(http) and http.source_of("authorization") == "argument token"
    generic = tensorstream.describe_credentials(
        "memory://bucket/x", storage_options={"secret": "canary-so", "region": "r1"}
    )
    assert "canary-so" not in str(generic) and "'region': 'r1'" in str(generic)


@pytest.mark.parametrize(
    ("env", "options", "expected", "source"),
    [
        ({"S3_ENDPOINT_URL": "a.example", "AWS_ENDPOINT_URL_S3": "http://b"},
         {"s3_endpoint": "http://o:9000"}, "http://o:9000", "option s3_endpoint"),
        ({"S3_ENDPOINT_URL": "a.example", "AWS_ENDPOINT_URL_S3": "http://b"}, {},
         "https://a.example", "env S3_ENDPOINT_URL"),
        ({"AWS_ENDPOINT_URL_S3": "http://b/", "AWS_ENDPOINT_URL": "http://c"}, {},
         "http://b", "env AWS_ENDPOINT_URL_S3"),
        ({"AWS_ENDPOINT_URL": "https://c:1/"}, {}, "https://c:1", "env AWS_ENDPOINT_URL"),
        ({}, {}, None, None),  # no vendor endpoint is ever assumed
    ],
)
def test_endpoint_precedence(
    isolated_env: Path, env: dict[str, str], options: dict[str, Any], expected: str | None,
    source: str | None,
) -> None:
    creds = resolve_s3_credentials(options, env={**env, "HOME": str(isolated_env / "home")})
    assert (creds.endpoint.value if creds.endpoint else None) == expected
    assert (creds.endpoint.source if creds.endpoint else None) == source


def test_region_and_token_precedence(isolated_env: Path) -> None:
    env = {"AWS_REGION": "r1", "AWS_DEFAULT_REGION": "r2", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    creds = resolve_s3_credentials({}, env=env)
    assert creds.region is not None and (creds.region.value, creds.region.source) == ("r1", "env AWS_REGION")
    assert creds.session_token is not None and creds.session_token.source == "env AWS_SESSION_TOKEN"
    assert "t" not in repr(creds.session_token).replace("Sourced", "").replace("token", "")
    assert resolve_s3_credentials({"s3_region": "r0"}, env=env).region.value == "r0"  # type: ignore[union-attr]
    # a token belongs to its own pair: S3_* keys do not pick up AWS_SESSION_TOKEN
    other = resolve_s3_credentials({}, env={**env, "S3_ACCESS_KEY_ID": "k2", "S3_SECRET_ACCESS_KEY": "s2"})
    assert other.session_token is None
    with pytest.raises(errors.ConfigurationError, match="s3_session_token"):
        resolve_s3_credentials({"s3_session_token": "t"}, env={})


def test_explicit_s3cfg_path_and_https_default(isolated_env: Path) -> None:
    cfg = isolated_env / "custom.s3cfg"
    cfg.write_text("[default]\naccess_key = k\nsecret_key = s\nhost_base = store.example\n"
                   "host_bucket = %(bucket)s.store.example\n")
    creds = resolve_s3_credentials({"s3_config_path": str(cfg)}, env={})
    assert creds.endpoint is not None and creds.endpoint.value == "https://store.example"
    assert creds.addressing_style is not None and creds.addressing_style.value == "virtual"
    assert creds.key_source == f"s3cmd config {cfg}"
    with pytest.raises(errors.ConfigurationError, match=r"missing\.s3cfg"):
        resolve_s3_credentials({"s3_config_path": str(isolated_env / "missing.s3cfg")}, env={})


@pytest.mark.parametrize(("endpoint", "problem"), [
    ("http://", "no host"), ("http://[::1", "Invalid IPv6 URL"), ("http://a:99999", "Port out of"),
    ("ftp://127.0.0.1", "not http or https"), ("http://u:pw-canary@:9", "no host"),
    ("http://a:b", "Port could not be cast"),
    # botocore's host check failed inside the credential chain: "credential chain failed"
    ("not a url", "refuses the host name 'not a url'"), ("http://minio_1:9000", "'minio_1'"),
    ("http://u:pw-canary@bad host:9", "refuses the host name"),
    # botocore's EndpointResolutionError, raw, quoted it whole (password, query token)
    ("http://u:pw-canary@h:9?x=1", "has a query"), ("http://h:9/p?pw-canary", "has a query"),
])
@pytest.mark.parametrize("where", ["option", "env"])
def test_an_endpoint_botocore_cannot_use_is_refused_naming_its_source(
        endpoint: str, problem: str, where: str) -> None:
    """botocore said 'Invalid IPv6 URL' or 'Port out of range' naming nothing, or for an
    endpoint without a host failed inside the credential chain (a ValueError)."""
    options = {"s3_endpoint": endpoint} if where == "option" else {}
    env = {} if where == "option" else {"S3_ENDPOINT_URL": endpoint}
    with pytest.raises(errors.ConfigurationError) as info:
        resolve_s3_credentials(options, env=env)
    text = str(info.value)
    assert problem in text and "is not an S3 endpoint URL" in text
    assert ("option s3_endpoint" if where == "option" else "env S3_ENDPOINT_URL") in text
    assert "pw-canary" not in text


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "https://s3.example.com",
                                      "s3.example.com", "http://[::1]:9000/", "HTTP://h"])
def test_a_usable_endpoint_is_kept(endpoint: str) -> None:
    creds = resolve_s3_credentials({"s3_endpoint": endpoint}, env={})
    assert creds.endpoint is not None


@pytest.mark.parametrize("where", ["env AWS_ENDPOINT_URL_S3", "env AWS_ENDPOINT_URL",
                                   "config file"])
@pytest.mark.parametrize("endpoint", ["minio:9000", "s3.example.com", "u:pw-canary@h:9"])
def test_an_aws_sdk_endpoint_without_a_scheme_is_refused_naming_its_source(
        isolated_env: Path, where: str, endpoint: str) -> None:
    """``--endpoint-url minio:9000`` was refused (exit 2) while ``AWS_ENDPOINT_URL=minio:9000``
    (or a profile's ``endpoint_url``) was taken as https://: a plain-text MinIO then failed
    in a TLS handshake. boto3 and the aws CLI refuse such an endpoint in their settings
    ("Invalid endpoint"); so does tensorstream now, saying how to write it, and never
    showing a password in it."""
    env = {"HOME": str(isolated_env / "home")}
    if where == "config file":
        config = isolated_env / "aws-config"
        config.write_text(f"[default]\nendpoint_url = {endpoint}\n")
        env["AWS_CONFIG_FILE"] = str(config)
    else:
        env[where.removeprefix("env ")] = endpoint
    with pytest.raises(errors.ConfigurationError) as info:
        resolve_s3_credentials({}, env=env)
    text = str(info.value)
    host = endpoint.rpartition("@")[2]
    assert f"has no scheme; write it as http://{host} (plain text) or https://{host} (TLS)" in text
    assert (where if where != "config file" else str(isolated_env / "aws-config")) in text
    assert "pw-canary" not in text


@pytest.mark.parametrize(("options", "env", "expected"), [
    ({"s3_endpoint": "s3.example.com"}, {}, "https://s3.example.com"),
    ({}, {"S3_ENDPOINT_URL": "object.example.com:8443"}, "https://object.example.com:8443"),
    ({"s3_config_path": "plain.s3cfg"}, {}, "http://127.0.0.1:9000"),
])
def test_tensorizers_and_s3cmds_endpoints_without_a_scheme_stay_as_they_were(
        isolated_env: Path, options: dict[str, Any], env: dict[str, str], expected: str) -> None:
    """The neighbours: tensorizer takes ``s3_endpoint``/``S3_ENDPOINT_URL`` without a scheme
    as https://, and s3cmd writes ``host_base`` without one (its ``use_https`` says which):
    those stay."""
    cfg = isolated_env / "plain.s3cfg"
    cfg.write_text("[default]\naccess_key = k\nsecret_key = s\nhost_base = 127.0.0.1:9000\n"
                   "use_https = False\n")
    if "s3_config_path" in options:
        options = {"s3_config_path": str(cfg)}
    creds = resolve_s3_credentials(options, env={**env, "HOME": str(isolated_env / "home")})
    assert creds.endpoint is not None and creds.endpoint.value == expected


@pytest.mark.parametrize("where", ["option s3_endpoint", "env AWS_ENDPOINT_URL",
                                   "env S3_ENDPOINT_URL"])
def test_an_endpoint_s_scheme_in_capitals_is_the_same_endpoint(where: str) -> None:
    """A scheme is case-insensitive (``HTTPS://minio:9000``), and botocore takes it so,
    but tensorstream compared it as written: the reads' choice of a trust store took
    ``HTTPS://`` for no TLS endpoint (botocore's, AWS_CA_BUNDLE's, left out). The scheme is
    written in lower case when the endpoint is resolved; the host and user info as given."""
    given = "HTTPS://u:Pw-canary@MinIO:9000/"
    name = where.partition(" ")[2]
    options = {"s3_endpoint": given} if where.startswith("option") else {}
    env = {} if options else {name: given}
    creds = resolve_s3_credentials(options, env=env)
    assert creds.endpoint is not None
    assert creds.endpoint.value == "https://u:Pw-canary@MinIO:9000"


@pytest.mark.parametrize("name", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_aws_sdk_endpoint_of_blanks_says_it_is_empty(name: str) -> None:
    """``AWS_ENDPOINT_URL=' '`` said ``'' has no scheme; write it as http:// (plain text)``:
    advice naming no host. A value of blanks is said to be empty."""
    with pytest.raises(errors.ConfigurationError,
                       match=f"env {name} is blank; unset it, or write it as "
                             r"http://host:port \(plain text\) or https://host:port \(TLS\)"):
        resolve_s3_credentials({}, env={name: " \t"})


@pytest.mark.parametrize("address", ["::1", "fd00::5", "2001:db8::1"])
def test_a_bare_ipv6_endpoint_without_a_scheme_is_advised_in_brackets(address: str) -> None:
    """``AWS_ENDPOINT_URL=::1`` was advised as ``http://::1``, which botocore refuses
    (Invalid IPv6 URL): an address of more than one ':' outside brackets is an IPv6
    literal, written in a URL as ``http://[::1]``."""
    with pytest.raises(errors.ConfigurationError,
                       match=re.escape(f"write it as http://[{address}] (plain text) or "
                                       f"https://[{address}] (TLS)")):
        resolve_s3_credentials({}, env={"AWS_ENDPOINT_URL": address})


def test_profile_option_and_variable_against_vllm_keys(isolated_env: Path) -> None:
    """docs/s3.md's order: ``s3_profile`` (the CLI's ``--profile``) beats vLLM's S3_ keys
    and ``AWS_PROFILE``; vLLM's S3_ keys beat ``AWS_PROFILE``; ``AWS_PROFILE`` alone
    chooses the profile for botocore's chain."""
    config = isolated_env / "aws-config"
    config.write_text("[profile opt]\n[profile envp]\n")
    env = {"AWS_CONFIG_FILE": str(config), "HOME": str(isolated_env),
           "AWS_SHARED_CREDENTIALS_FILE": str(isolated_env / "aws-credentials")}
    vllm = {"S3_ACCESS_KEY_ID": "k", "S3_SECRET_ACCESS_KEY": "s"}
    both = resolve_s3_credentials({"s3_profile": "opt"},
                                  env={**env, **vllm, "AWS_PROFILE": "envp"})
    assert both.profile is not None and both.profile.source == "option s3_profile"
    assert both.access_key_id is None and both.uses_botocore_chain
    keys = resolve_s3_credentials({}, env={**env, **vllm, "AWS_PROFILE": "envp"})
    assert keys.profile is None and keys.key_source == "env S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY"
    alone = resolve_s3_credentials({}, env={**env, "AWS_PROFILE": "envp"})
    assert alone.profile is not None and alone.profile.value == "envp"
    assert alone.uses_botocore_chain
