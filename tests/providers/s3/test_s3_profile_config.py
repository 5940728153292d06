"""What a profile of the AWS config file says about S3 (providers/s3/profile.py): its
``s3 = addressing_style``, its ``endpoint_url`` and its ``services`` section's, and
``ignore_configured_endpoint_urls``, honoured as boto3 honours them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.providers.s3.config import resolve_s3_credentials
from tensorstream.providers.s3.provider import S3Provider
from tensorstream.testing.s3_server import MotoS3Server


@pytest.fixture
def aws_config(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = isolated_env / "aws-config"
    path.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    return path


def _urls(options: dict[str, Any]) -> tuple[str, str]:
    """The object URL tensorstream reads and the one boto3 builds, for the same setup."""
    import boto3

    provider = S3Provider.from_uri(f"s3://{S3_BUCKET}/k", **options)
    client, _pool = provider._reads_state()
    ours = provider._gets.object_url(client, S3_BUCKET, "k")
    theirs = boto3.session.Session().client("s3").generate_presigned_url(  # a fresh config
        "get_object", Params={"Bucket": S3_BUCKET, "Key": "k"}).split("?", 1)[0]
    return ours, theirs


#: AWS config file, variables: what boto3 honours (each URL checked against boto3's).
BOTO3_SETUPS = {
    "profile style over our path default": (
        "[default]\ns3 =\n  addressing_style = virtual\n",
        {"AWS_ENDPOINT_URL_S3": "http://localhost:9000"}),
    "profile endpoint and style": (
        "[default]\nendpoint_url = http://store.example:9000\ns3 =\n  addressing_style = virtual\n",
        {}),
    "profile endpoint, path for a custom endpoint": (
        "[default]\nendpoint_url = http://store.example:9000\n", {}),
    "named profile": (
        "[default]\ns3 =\n  addressing_style = path\n[profile p]\n"
        "endpoint_url = http://p.example\ns3 =\n  addressing_style = virtual\n",
        {"AWS_PROFILE": "p"}),
    "keys from variables: botocore's profile variable order": (
        "[profile a]\nendpoint_url = http://a.example\n[profile b]\nendpoint_url = http://b.example\n",
        {"AWS_PROFILE": "a", "AWS_DEFAULT_PROFILE": "b"}),
    "services section beats the profile's endpoint": (
        "[default]\nendpoint_url = http://profile.example\nservices = m\n"
        "[services m]\ns3 =\n  endpoint_url = http://services.example:9000\n", {}),
    "AWS_ENDPOINT_URL beats the services section": (
        "[default]\nservices = m\n[services m]\ns3 =\n  endpoint_url = http://services.example\n",
        {"AWS_ENDPOINT_URL": "http://global.example:1"}),
    "AWS_ENDPOINT_URL_S3 beats AWS_ENDPOINT_URL": (
        "", {"AWS_ENDPOINT_URL": "http://global.example:1",
             "AWS_ENDPOINT_URL_S3": "http://s3.example:2"}),
    "ignored by variable": (
        "[default]\nendpoint_url = http://profile.example\n",
        {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "TRUE", "AWS_ENDPOINT_URL_S3": "http://s3.example"}),
    "ignored by the profile": (
        "[default]\nignore_configured_endpoint_urls = true\nendpoint_url = http://profile.example\n",
        {"AWS_ENDPOINT_URL": "http://global.example"}),
    "the variable's false beats the profile's true": (
        "[default]\nignore_configured_endpoint_urls = true\n",
        {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "false", "AWS_ENDPOINT_URL": "http://g.example"}),
    "only 'true' ignores (botocore's reading)": (
        "[default]\nignore_configured_endpoint_urls = 1\nendpoint_url = http://profile.example\n",
        {}),
}


@pytest.mark.parametrize("setup", BOTO3_SETUPS)
def test_the_object_url_is_the_one_boto3_builds(aws_config: Path, monkeypatch: pytest.MonkeyPatch,
                                                 setup: str) -> None:
    config, env = BOTO3_SETUPS[setup]
    aws_config.write_text(config)
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00", "AWS_SECRET_ACCESS_KEY": "s",
                        "AWS_REGION": "us-east-1", **env}.items():
        monkeypatch.setenv(name, value)
    ours, theirs = _urls({})
    assert ours == theirs


async def test_a_read_goes_to_the_endpoint_of_the_services_section_and_errors_name_it(
        aws_config: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    moto_s3.put(S3_BUCKET, "profile-config", b"from the services section")
    aws_config.write_text(f"[profile m]\nservices = local\n[services local]\n"
                          f"s3 =\n  endpoint_url = {moto_s3.endpoint_url}\n"
                          "  addressing_style = virtual\n")  # not this profile's: ignored
    monkeypatch.setenv("AWS_PROFILE", "m")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3.secret_access_key)
    data = await tensorstream.read_range(f"s3://{S3_BUCKET}/profile-config", 0, 25)
    assert data == b"from the services section"
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/profile-config")
    assert report.source_of("endpoint") == f"{aws_config} [services local] s3.endpoint_url"
    assert report.source_of("addressing_style") == "default for a custom endpoint"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123")
    with pytest.raises(errors.PermissionDeniedError, match=moto_s3.endpoint_url):
        await tensorstream.read_range(f"s3://{S3_BUCKET}/profile-config", 0, 1)


def test_which_setting_wins(aws_config: Path) -> None:
    aws_config.write_text("[default]\nendpoint_url = http://profile.example\n"
                          "s3 =\n  addressing_style = virtual\n")
    env = {"AWS_CONFIG_FILE": str(aws_config)}
    creds = resolve_s3_credentials({}, env=env)
    assert creds.endpoint is not None and creds.endpoint.value == "http://profile.example"
    assert creds.addressing_style is not None
    assert creds.addressing_style.source == f"{aws_config} [profile default] s3.addressing_style"
    # the option beats the profile; tensorstream's own endpoints beat it, ignored or not
    opt = resolve_s3_credentials({"s3_addressing_style": "path"}, env=env)
    assert opt.addressing_style is not None and opt.addressing_style.value == "path"
    ignored = {**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true",
               "AWS_ENDPOINT_URL": "http://aws.example"}
    assert resolve_s3_credentials({}, env=ignored).endpoint is None
    for options, extra, source in (({"s3_endpoint": "http://o.example"}, {}, "option s3_endpoint"),
                                   ({}, {"S3_ENDPOINT_URL": "http://v.example"},
                                    "env S3_ENDPOINT_URL")):
        kept = resolve_s3_credentials(options, env={**ignored, **extra}).endpoint
        assert kept is not None and kept.source == source
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k", anonymous=True)
    assert report.source_of("endpoint") == f"{aws_config} [profile default] endpoint_url"
    # ~/.s3cfg's endpoint is addressed as s3cmd's host_bucket says, not as the AWS profile
    s3cfg = aws_config.parent / "s3cfg"
    s3cfg.write_text("[default]\nhost_base = minio.example:9000\nhost_bucket = minio.example:9000\n")
    creds = resolve_s3_credentials({"s3_config_path": str(s3cfg)}, env=env)
    assert creds.addressing_style is not None
    assert creds.addressing_style.source == f"s3cmd config {s3cfg} host_bucket"
    assert creds.addressing_style.value == "path"


@pytest.mark.parametrize(("config", "match"), [
    ("[default]\ns3 =\n  addressing_style = pathstyle\n",
     r"\[profile default\] s3.addressing_style must be one of path, virtual, auto"),
    ("[default]\nservices = nowhere\n", "names services section 'nowhere'"),
    ("[default]\nendpoint_url = ftp://store.example\n", r"\[profile default\] endpoint_url"),
    # botocore: an AttributeError in its credential chain, "what it printed is withheld"
    ("[default]\nservices = m\n[services m]\ns3 = http://store.example\n",
     r"\[services m\] s3 is a value; it must be a sub-section"),
    ("[default]\ns3 = path\n", r"\[profile default\] s3 is a value; it must be a sub-section"),
])
def test_a_profile_setting_botocore_cannot_use_names_the_file(aws_config: Path, config: str,
                                                              match: str) -> None:
    aws_config.write_text(config)
    with pytest.raises(errors.ConfigurationError, match=match) as info:
        resolve_s3_credentials({}, env={"AWS_CONFIG_FILE": str(aws_config)})
    assert str(aws_config) in str(info.value)


async def test_a_missing_profile_named_by_a_variable_is_named_where_keys_came_from_elsewhere(
        aws_config: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore configures itself from AWS_PROFILE even when the keys are vLLM's variables
    (as boto3 does, it refuses a profile that is not there): the error said
    "AWS profile None () is not defined"."""
    monkeypatch.setenv("AWS_PROFILE", "nope")
    monkeypatch.setenv("S3_ACCESS_KEY_ID", moto_s3.access_key_id)
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", moto_s3.secret_access_key)
    monkeypatch.setenv("S3_ENDPOINT_URL", moto_s3.endpoint_url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    aws_config.write_text("[default]\nregion = us-east-1\n")  # botocore reads the file
    with pytest.raises(errors.ConfigurationError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1)
    assert (f"AWS profile 'nope' (env AWS_PROFILE) is not defined in {aws_config}"
            in str(info.value))
    assert moto_s3.secret_access_key not in str(info.value)


def test_aws_default_profile_is_the_profile_named(aws_config: Path, isolated_env: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore takes AWS_DEFAULT_PROFILE's keys; the report named profile 'default'."""
    credentials = isolated_env / "aws-credentials"
    credentials.write_text("[p]\naws_access_key_id = AKIAEXAMPLEEXAMPLE42\n"
                           "aws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_DEFAULT_PROFILE", "p")
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k")
    assert report.source_of("profile") == "env AWS_DEFAULT_PROFILE"
    assert report.source_of("access_key_id") == f"{credentials} [profile p]"
    aws_config.write_text("[profile q]\n")
    monkeypatch.setenv("AWS_PROFILE", "q")  # both set: botocore takes AWS_DEFAULT_PROFILE
    profile = resolve_s3_credentials({}).profile
    assert profile is not None and (profile.value, profile.source) == ("p", "env AWS_DEFAULT_PROFILE")


@pytest.mark.parametrize("where", ["env", "profile"])
async def test_a_ca_bundle_from_the_aws_configuration_is_used_and_named_when_unusable(
        aws_config: Path, moto_s3_tls: MotoS3Server, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, where: str) -> None:
    """AWS_CA_BUNDLE / the profile's ca_bundle: "cannot load the CA bundle /x" did not say
    which setting named /x."""
    moto_s3_tls.put(S3_BUCKET, "tls-object", b"verified")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_s3_tls.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_s3_tls.secret_access_key)
    junk = tmp_path / "not-a-pem"
    junk.write_text("no certificate here\n")

    def configure(ca: str) -> None:
        line = f"ca_bundle = {ca}\n" if where == "profile" else ""
        aws_config.write_text(f"[default]\nendpoint_url = {moto_s3_tls.endpoint_url}\n{line}")
        if where == "env":
            monkeypatch.setenv("AWS_CA_BUNDLE", ca)

    assert moto_s3_tls.ca_bundle_path is not None
    configure(moto_s3_tls.ca_bundle_path)
    assert await tensorstream.read_range(f"s3://{S3_BUCKET}/tls-object", 0, 8) == b"verified"
    for ca in (str(junk), str(tmp_path / "absent.pem")):
        configure(ca)
        with pytest.raises(errors.ConfigurationError) as info:
            await tensorstream.read_range(f"s3://{S3_BUCKET}/tls-object", 0, 8)
        named = "env AWS_CA_BUNDLE" if where == "env" else f"{aws_config} [profile default] ca_bundle"
        assert f"cannot load the CA bundle {ca}" in str(info.value)
        assert f"(set by {named})" in str(info.value)


@pytest.mark.parametrize("where", ["S3_ENDPOINT_URL", "profile"])
def test_the_report_masks_a_password_in_the_endpoint(aws_config: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     where: str) -> None:
    """describe_credentials printed ``http://user:<password>@host`` whole."""
    endpoint = "http://user:canary-pw@store.example:9000"
    if where == "profile":
        aws_config.write_text(f"[default]\nendpoint_url = {endpoint}\n")
    else:
        monkeypatch.setenv(where, endpoint)
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k", anonymous=True)
    assert "canary-pw" not in str(report) and "canary-pw" not in repr(report.as_dict())
    assert "user:***@store.example:9000" in str(report)


@pytest.mark.parametrize("file", ["config", "credentials"])
async def test_keys_from_a_credential_process_are_named_by_profile_and_file(
        aws_config: Path, isolated_env: Path, moto_s3: MotoS3Server,
        monkeypatch: pytest.MonkeyPatch, file: str) -> None:
    """A key the server rejects was said to come from "botocore custom-process": which
    profile's, in which file, was left to guess."""
    import sys

    script = isolated_env / "keys.py"
    script.write_text("import json\nprint(json.dumps({'Version': 1, "
                      "'AccessKeyId': 'AKIAREJECTEDREJECTED', 'SecretAccessKey': 'wrong-0123'}))\n")
    setting = f"credential_process = {sys.executable} {script}\n"
    credentials = isolated_env / "aws-credentials"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "proc")
    aws_config.write_text(f"[profile proc]\nendpoint_url = {moto_s3.endpoint_url}\n"
                          + (setting if file == "config" else ""))
    credentials.write_text("[proc]\n" + (setting if file == "credentials" else ""))
    named = f"{aws_config if file == 'config' else credentials} [profile proc] credential_process"
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k")
    assert report.source_of("access_key_id") == f"{named} (botocore custom-process)"
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/k", 0, 1)
    assert named in str(info.value) and "wrong-0123" not in str(info.value)


@pytest.mark.parametrize(("options", "env", "named"), [
    ({"s3_region": "eu west 1"}, {}, "option s3_region 'eu west 1'"),
    ({}, {"AWS_REGION": "us-east-1 "}, "env AWS_REGION 'us-east-1 '"),
    ({}, {"AWS_DEFAULT_REGION": "eu/west"}, "env AWS_DEFAULT_REGION 'eu/west'"),
])
async def test_a_region_that_is_no_region_name_is_refused_naming_its_source(
        aws_config: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch,
        options: dict[str, Any], env: dict[str, str], named: str) -> None:
    """botocore's InvalidRegionError became "S3 sent a malformed answer"; reads that built
    no botocore client (static keys, an http endpoint) signed for it."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    opts = {**moto_s3.options(), **options}
    if not options:
        del opts["s3_region"]
    with pytest.raises(errors.ConfigurationError, match="is not a region name") as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/k", 0, 1, **opts)
    assert named in str(info.value)


async def test_a_profile_region_that_is_no_region_name_names_the_profile(
        aws_config: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    aws_config.write_text("[profile r]\nregion = eu west 1\n")
    monkeypatch.setenv("AWS_PROFILE", "r")
    opts = moto_s3.options()
    del opts["s3_region"]
    with pytest.raises(errors.ConfigurationError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/k", 0, 1, **opts)
    assert "AWS profile 'r'" in str(info.value) and str(aws_config) in str(info.value)
    assert "region 'eu west 1' is not a region name" in str(info.value)


def test_the_report_says_configured_endpoints_are_ignored(aws_config: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    aws_config.write_text("[default]\nendpoint_url = http://profile.example\n")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3.example")
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k", anonymous=True)
    assert report.source_of("endpoint") == (
        "AWS (configured endpoint URLs ignored: env AWS_IGNORE_CONFIGURED_ENDPOINT_URLS)")


async def test_a_named_profile_is_not_sent_to_the_endpoint_of_the_s3cmd_file(
        aws_config: Path, isolated_env: Path, moto_s3: MotoS3Server,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_PROFILE=p skipped ~/.s3cfg's keys but took its host_base: p's keys were signed
    for, and sent to, another store's endpoint (boto3 would use p's own)."""
    moto_s3.put(S3_BUCKET, "named-profile", b"profile p")
    credentials = isolated_env / "aws-credentials"
    credentials.write_text(f"[p]\naws_access_key_id = {moto_s3.access_key_id}\n"
                           f"aws_secret_access_key = {moto_s3.secret_access_key}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    aws_config.write_text(f"[profile p]\nendpoint_url = {moto_s3.endpoint_url}\n")
    s3cfg = isolated_env / "home" / ".s3cfg"
    s3cfg.write_text("[default]\nhost_base = 127.0.0.1:1\nuse_https = False\n")
    monkeypatch.setenv("AWS_PROFILE", "p")
    assert await tensorstream.read_range(f"s3://{S3_BUCKET}/named-profile", 0, 9) == b"profile p"
    report = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/named-profile")
    assert report.source_of("endpoint") == f"{aws_config} [profile p] endpoint_url"
    # given by name, the s3cmd file's endpoint still applies (its keys do not)
    explicit = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k", s3_config_path=str(s3cfg))
    assert explicit.source_of("endpoint") == f"s3cmd config {s3cfg} host_base"


def test_the_region_botocore_takes_is_named_by_the_profile_it_takes_it_from(
        aws_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys from variables and AWS_PROFILE=p: botocore signs for p's region; the report
    said it came from '[profile default]'."""
    aws_config.write_text("[default]\nregion = us-west-1\n[profile p]\nregion = eu-north-1\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_PROFILE", "p")
    region = tensorstream.describe_credentials(f"s3://{S3_BUCKET}/k").as_dict()["region"]
    assert region == {"value": "eu-north-1", "source": f"{aws_config} [profile p] region"}


def test_a_profile_section_without_its_prefix_in_the_config_file_says_so(
        aws_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[p]`` in the config file is no profile to botocore (``[profile p]`` is): the
    error says which to write."""
    aws_config.write_text("[p]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_PROFILE", "p")
    with pytest.raises(errors.ConfigurationError, match=r"its section is \[profile p\], not \[p\]"):
        resolve_s3_credentials({})


def test_the_profile_read_does_not_show_its_keys(aws_config: Path) -> None:
    from tensorstream.providers.s3.profile import read_profile_config

    aws_config.write_text("[default]\naws_access_key_id = AKIAEXAMPLEEXAMPLE00\n"
                          "aws_secret_access_key = canary-secret\n")
    read = read_profile_config(None, {"AWS_CONFIG_FILE": str(aws_config)})
    assert "canary-secret" not in repr(read) and "canary-secret" not in str(read)


@pytest.mark.parametrize("endpoint", ["light", "aws"])
async def test_aws_profile_default_without_a_default_profile_is_refused_on_every_path(
        aws_config: Path, moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch,
        endpoint: str) -> None:
    """boto3 refuses AWS_PROFILE=default when no file defines it; reads that built a botocore
    client did too, and the others went on (an http endpoint with static keys)."""
    monkeypatch.setenv("AWS_PROFILE", "default")
    opts = moto_s3.options() if endpoint == "light" else {
        "s3_access_key_id": "AKIAEXAMPLEEXAMPLE00", "s3_secret_access_key": "s"}
    with pytest.raises(errors.ConfigurationError,
                       match="AWS profile 'default' \\(env AWS_PROFILE\\) is not defined"):
        await tensorstream.read_range(f"s3://{S3_BUCKET}/k", 0, 1, **opts)
    aws_config.write_text("[default]\n")  # defined (empty): fine
    if endpoint == "light":
        with pytest.raises(errors.NotFoundError):
            await tensorstream.read_range(f"s3://{S3_BUCKET}/absent", 0, 1, **opts)
