"""S3 credentials: every source in the precedence order, proven against moto's
server that checks signatures; half pairs, missing credentials, rejected
credentials, describe_credentials, and TLS."""

from __future__ import annotations

import json
import logging
import os
import traceback
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.providers.s3.config import resolve_s3_credentials
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


@pytest.fixture
def sources(isolated_env: Path, monkeypatch: pytest.MonkeyPatch, moto_s3: MotoS3Server) -> Sources:
    return Sources(isolated_env / "home", monkeypatch, moto_s3)


@pytest.fixture(scope="module")
def model_file(moto_s3: MotoS3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small state dict serialized by tensorizer, uploaded with boto3."""
    import torch
    from tensorizer import TensorSerializer

    gen = torch.Generator().manual_seed(3)
    tensors = {
        "embed.weight": torch.randn(300, 64, generator=gen),
        "layer.0.weight": torch.randn(64, 64, generator=gen).to(torch.float16),
        "layer.0.bias": torch.arange(64, dtype=torch.int32),
        "head.weight": torch.randn(1000, 32, generator=gen),
    }
    path = tmp_path_factory.mktemp("model") / "model.tensors"
    serializer = TensorSerializer(str(path))
    serializer.write_state_dict(tensors)
    serializer.close()
    moto_s3.put(S3_BUCKET, "model.tensors", path.read_bytes())
    return tensors


def _load(uri: str, **options: Any) -> dict[str, Any]:
    from tensorizer import TensorDeserializer

    with tensorstream.open(uri, **options) as f:
        deserializer = TensorDeserializer(f, device="cpu")
        try:
            return {name: t.clone() for name, t in deserializer.items()}
        finally:
            deserializer.close()


# -- one test per source, proving precedence -----------------------------------------
@pytest.mark.parametrize("level", LEVELS)
def test_tensorizer_loads_with_credentials_from_each_source(
    sources: Sources, model_file: dict[str, Any], level: str
) -> None:
    """Valid keys at ``level``, wrong keys at every lower level: the load only
    works if ``level`` wins, and describe_credentials names it."""
    import torch

    sources.good(level)
    for lower in LEVELS[LEVELS.index(level) + 1 :]:
        sources.bad(lower)
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/model.tensors", **sources.options)
    assert SOURCE[level] in (report.source_of("access_key_id") or "")
    loaded = _load(f"s3://{S3_BUCKET}/model.tensors", **sources.options)
    assert loaded.keys() == model_file.keys()
    for name, tensor in model_file.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("level", LEVELS)
async def test_rejected_credentials_name_their_source_not_the_secret(
    sources: Sources, level: str
) -> None:
    """Wrong keys at ``level`` beat valid keys below it; the error names the source."""
    sources.bad(level)
    for lower in LEVELS[LEVELS.index(level) + 1 :]:
        sources.good(lower)
    with pytest.raises(PermissionError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1, **sources.options)
    assert isinstance(info.value, errors.PermissionDeniedError)
    text = "".join(traceback.format_exception(info.value))
    assert SOURCE[level] in str(info.value)
    assert BAD_SECRET not in text and BAD_SECRET not in repr(info.value)


def test_named_profile_from_aws_profile_and_option(sources: Sources, moto_s3: MotoS3Server) -> None:
    sources.aws_credentials.write_text(
        f"[default]\naws_access_key_id = {BAD_KEY}\naws_secret_access_key = {BAD_SECRET}\n"
        f"[models]\naws_access_key_id = {moto_s3.access_key_id}\n"
        f"aws_secret_access_key = {moto_s3.secret_access_key}\n"
    )
    moto_s3.put(S3_BUCKET, "profiled", b"via a named profile")
    uri = f"s3://{S3_BUCKET}/profiled"
    opts: dict[str, Any] = {"s3_endpoint": moto_s3.endpoint_url}
    with tensorstream.open(uri, s3_profile="models", **opts) as f:
        assert f.read() == b"via a named profile"
    sources.mp.setenv("AWS_PROFILE", "models")
    sources.bad("s3cfg")  # AWS_PROFILE outranks ~/.s3cfg
    with tensorstream.open(uri, **opts) as f:
        assert f.read() == b"via a named profile"
    report = tensorstream.describe_credentials(uri, **opts)
    assert report.source_of("profile") == "env AWS_PROFILE"
    assert "[profile models]" in (report.source_of("secret_access_key") or "")


def test_half_pair_is_an_error_naming_both_variables(sources: Sources, moto_s3: MotoS3Server) -> None:
    sources.good("aws_env")  # a complete pair lower down must not be mixed in
    sources.mp.setenv("S3_ACCESS_KEY_ID", moto_s3.access_key_id)
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.open(f"s3://{S3_BUCKET}/model.tensors")
    assert "S3_ACCESS_KEY_ID" in str(info.value) and "S3_SECRET_ACCESS_KEY" in str(info.value)
    with pytest.raises(errors.ConfigurationError, match="s3_access_key_id"):
        tensorstream.open(f"s3://{S3_BUCKET}/x", "rb", s3_secret_access_key=BAD_SECRET)


async def test_half_pair_in_aws_credentials_file_is_an_error(sources: Sources, moto_s3: MotoS3Server) -> None:
    sources.aws_credentials.write_text(f"[default]\naws_access_key_id = {moto_s3.access_key_id}\n")
    with pytest.raises(errors.ConfigurationError, match="aws_secret_access_key"):
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", s3_endpoint=moto_s3.endpoint_url)
    with pytest.raises(errors.ConfigurationError, match="aws_secret_access_key"):
        tensorstream.describe_credentials(f"s3://{S3_BUCKET}/x")



HALF_PAIRS = {  # which file, its text, the profile, the half it sets
    "credentials, key id only": ("credentials", "[default]\naws_access_key_id = {key}\n", None,
                                 "aws_access_key_id"),
    "credentials, secret only": ("credentials", "[default]\naws_secret_access_key = {secret}\n",
                                 None, "aws_secret_access_key"),
    "config, key id only": ("config", "[profile work]\naws_access_key_id = {key}\n", "work",
                            "aws_access_key_id"),
    "config, secret only": ("config", "[profile work]\naws_secret_access_key = {secret}\n",
                            "work", "aws_secret_access_key"),
}


@pytest.mark.parametrize("case", sorted(HALF_PAIRS))
async def test_half_pair_in_an_aws_file_names_the_file_profile_and_both_halves(
        sources: Sources, moto_s3: MotoS3Server, case: str) -> None:
    # Was, for a key id only, "half of an S3 key pair in shared-credentials-file:
    # aws_secret_access_key is missing" (no file, no profile); for a secret only,
    # nothing: botocore skips the profile, so "no S3 credentials found" (or, on a
    # cloud machine, the instance's role).
    which, text, profile, present = HALF_PAIRS[case]
    path = sources.aws_credentials if which == "credentials" else sources.aws_config
    path.write_text(text.format(key=moto_s3.access_key_id, secret=BAD_SECRET))
    options: dict[str, Any] = {"s3_endpoint": moto_s3.endpoint_url, "retries": 1}
    if profile:
        options["s3_profile"] = profile
    uri = f"s3://{S3_BUCKET}/x"
    for attempt in (lambda: tensorstream.open(uri, **options),
                    lambda: tensorstream.describe_credentials(uri, **options)):
        with pytest.raises(errors.ConfigurationError) as info:
            attempt()
        message = str(info.value)
        assert f"{path} [profile {profile or 'default'}] sets {present} but not" in message
        assert "aws_access_key_id" in message and "aws_secret_access_key" in message
        assert BAD_SECRET not in _everything_said(info.value)
    with pytest.raises(errors.ConfigurationError, match=r"\[profile"):
        await tensorstream.stat(uri, **options)



@pytest.mark.parametrize("how", ["directory", "dangling link", "no read permission"])
async def test_an_aws_file_that_cannot_be_read_is_named(
        sources: Sources, moto_s3: MotoS3Server, how: str) -> None:
    # botocore skips a credentials file it cannot read (configparser ignores the
    # OSError): it said "no S3 credentials found", as if the file were not there.
    path = sources.aws_credentials
    if how == "directory":
        path.mkdir()
    elif how == "dangling link":
        path.symlink_to(path.parent / "gone")
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path.write_text(f"[default]\naws_access_key_id = {BAD_KEY}\n"
                        f"aws_secret_access_key = {BAD_SECRET}\n")
        path.chmod(0)
    with pytest.raises(errors.ConfigurationError, match="cannot read the AWS credentials") as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", s3_endpoint=moto_s3.endpoint_url,
                                retries=1)
    assert str(path) in str(info.value)


def _everything_said(exc: BaseException) -> str:
    """Every message, attribute and traceback line of ``exc`` and its whole chain."""
    parts = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        parts += [repr(node), str(node), repr(vars(node)) if hasattr(node, "__dict__") else ""]
        node = node.__cause__ or node.__context__
    return "\n".join(parts)


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
        assert BAD_SECRET not in _everything_said(info.value)
    with pytest.raises(errors.ConfigurationError) as info:
        await tensorstream.stat(uri, s3_endpoint=moto_s3.endpoint_url, retries=1)
    assert BAD_SECRET not in _everything_said(info.value)



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
        assert BAD_SECRET not in _everything_said(info.value)
    assert "CredentialRetrievalError: (message withheld" in caplog.text  # traceback kept
    assert BAD_SECRET not in caplog.text



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


async def test_missing_credentials_list_every_place_and_no_secret(
    sources: Sources, moto_s3: MotoS3Server
) -> None:
    sources.mp.setenv("AWS_SESSION_TOKEN", BAD_SECRET)  # a token without its pair: unused
    with pytest.raises(errors.MissingCredentialsError) as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", s3_endpoint=moto_s3.endpoint_url)
    message = str(info.value)
    for place in ("s3_access_key_id", "S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID", ".s3cfg",
                  str(sources.aws_credentials), str(sources.aws_config), "instance metadata"):
        assert place in message
    assert BAD_SECRET not in message
    # ... and what to do (it stopped at the list of places).
    assert message.endswith("instance metadata)); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                            "(or a profile in ~/.aws), or anonymous=True (tensorstream: "
                            "--no-sign-request) for a public bucket")
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/x")
    assert report.looked_in and report.source_of("access_key_id") is None


async def test_anonymous_only_when_asked(sources: Sources, moto_s3_public: MotoS3Server) -> None:
    moto_s3_public.client.put_object(Bucket=S3_BUCKET, Key="public.bin", Body=b"for everyone",
                                     ACL="public-read")
    uri = f"s3://{S3_BUCKET}/public.bin"
    with pytest.raises(errors.MissingCredentialsError):
        await tensorstream.stat(uri, s3_endpoint=moto_s3_public.endpoint_url)
    got = await tensorstream.read_range(uri, 0, 12, s3_endpoint=moto_s3_public.endpoint_url,
                                        anonymous=True)
    assert got == b"for everyone"
    report = tensorstream.describe_credentials(uri, anonymous=True)
    assert report.source_of("access_key_id") is None and "unsigned" in str(report)


# -- describe_credentials -------------------------------------------------------------
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


# -- precedence of the other values (pure resolution) --------------------------------
@pytest.mark.parametrize(
    ("env", "options", "expected", "source"),
    [
        ({"S3_ENDPOINT_URL": "a.example", "AWS_ENDPOINT_URL_S3": "http://b"},
         {"s3_endpoint": "http://o:9000"}, "http://o:9000", "option s3_endpoint"),
        ({"S3_ENDPOINT_URL": "a.example", "AWS_ENDPOINT_URL_S3": "http://b"}, {},
         "https://a.example", "env S3_ENDPOINT_URL"),
        ({"AWS_ENDPOINT_URL_S3": "http://b/", "AWS_ENDPOINT_URL": "http://c"}, {},
         "http://b", "env AWS_ENDPOINT_URL_S3"),
        ({"AWS_ENDPOINT_URL": "c:1"}, {}, "https://c:1", "env AWS_ENDPOINT_URL"),
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


# -- TLS ------------------------------------------------------------------------------
@pytest.fixture
def tls(moto_s3_tls: MotoS3Server, isolated_env: Path) -> MotoS3Server:
    moto_s3_tls.put(S3_BUCKET, "tls.bin", b"over https")
    return moto_s3_tls


def _read_tls(server: MotoS3Server, **extra: Any) -> bytes:
    opts = server.options(**extra)
    if "ca_bundle" in extra and extra["ca_bundle"] is None:
        opts.pop("ca_bundle")
    with tensorstream.open(f"s3://{S3_BUCKET}/tls.bin", **opts) as f:
        return f.read()


def test_untrusted_certificate_is_refused_by_default(tls: MotoS3Server) -> None:
    with pytest.raises(ConnectionError, match="ca_bundle") as info:
        _read_tls(tls, ca_bundle=None, retries=3)
    assert not isinstance(info.value, errors.RetriesExhaustedError)  # not retried


def test_certificate_accepted_with_ca_bundle(tls: MotoS3Server) -> None:
    assert _read_tls(tls) == b"over https"


def test_insecure_accepts_and_warns(tls: MotoS3Server) -> None:
    with pytest.warns(errors.InsecureTLSWarning, match="insecure"):
        assert _read_tls(tls, ca_bundle=None, insecure=True) == b"over https"


def test_no_warning_without_insecure(tls: MotoS3Server) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _read_tls(tls) == b"over https"




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
    assert "canary" not in _everything_said(info.value).lower()


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
    assert "canary" not in _everything_said(info.value) + repr(info.value.args)


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


@pytest.mark.parametrize("given", [{"s3_access_key_id": "AKIDCANARY", "s3_secret_access_key": "SK"},
                                   {"s3_profile": "dev"}])
def test_anonymous_with_explicit_credentials_is_a_contradiction(
        sources: Sources, given: dict[str, str]) -> None:
    # The keys (or profile) were dropped without a word and requests went unsigned
    with pytest.raises(errors.ConfigurationError, match=r"anonymous=True .* contradict") as info:
        tensorstream.get_provider(f"s3://{S3_BUCKET}/k", anonymous=True, **given)
    assert "AKIDCANARY" not in str(info.value)
    # keys from the environment are still overridden by anonymous=True, as before
    sources.good("s3_env")
    creds = resolve_s3_credentials({"anonymous": True}, env=dict(os.environ))
    assert creds.anonymous and creds.access_key_id is None


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


@pytest.mark.parametrize("level", ["options", "s3_env", "aws_env"])
async def test_a_key_with_whitespace_around_it_is_said_when_refused(
    sources: Sources, level: str
) -> None:
    """A key pair with a space around it (a pasted key, ``S3_SECRET_ACCESS_KEY="$KEY "``)
    was sent as it is and refused with a bare 403 naming only its source (a line break is
    refused before any request). The refusal now says which of the two has whitespace
    around it, never the value; a wrong key without any says what it said."""
    s = sources.server
    sources.put(level, s.access_key_id, f" {s.secret_access_key} ", s.endpoint_url)
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1, **sources.options)
    said = str(info.value)
    assert SOURCE[level] in said and "its secret key has whitespace around it" in said, said
    assert s.secret_access_key not in said and s.secret_access_key not in repr(info.value)
    sources.put(level, s.access_key_id + " ", s.secret_access_key, s.endpoint_url)
    with pytest.raises(errors.PermissionDeniedError, match="its access key id has whitespace"):
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1, **sources.options)
    sources.bad(level)
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1, **sources.options)
    assert "whitespace" not in str(info.value)
