"""S3 credentials: every source in the precedence order, proven against moto's server that
checks signatures; named profiles, half pairs, unreadable files, missing and rejected
credentials, anonymous access. Resolution without a request, botocore's chain, header
characters and TLS each have a file of their own (test_s3_credential_*.py, test_s3_tls.py)."""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import pytest
from s3_credential_sources import BAD_KEY, BAD_SECRET, LEVELS, SOURCE, Sources, everything_said

import tensorstream
from fixtures_s3 import S3_BUCKET
from tensorstream import errors
from tensorstream.providers.s3.config import resolve_s3_credentials
from tensorstream.testing.s3_server import MotoS3Server


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
        assert BAD_SECRET not in everything_said(info.value)
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


@pytest.mark.parametrize("level", ["s3_env", "aws_env", "options"])
async def test_a_temporary_key_id_sent_without_a_token_is_said_when_refused(
    sources: Sources, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    """STS keys (``ASIA...``) in vLLM's S3_ variables beside an AWS_SESSION_TOKEN (which
    belongs to the AWS_ pair) went without it: S3 answered that the key id "does not
    exist", with no word of the token. The refusal now says the key id is a temporary one
    sent without a token and where a token goes; never a value."""
    s = sources.server
    monkeypatch.setenv("AWS_SESSION_TOKEN", "canary-TOKEN-0123456789")
    sources.put(level, "ASIATEMPORARYKEY0001", BAD_SECRET, s.endpoint_url)
    if level == "aws_env":  # its own token goes with it: nothing to say
        monkeypatch.delenv("AWS_SESSION_TOKEN")
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1, **sources.options)
    said = str(info.value)
    assert SOURCE[level] in said and "temporary one, ASIA..., sent without a session token" \
        in said, said
    assert "vLLM's S3_ variables take none" in said
    everything = everything_said(info.value)
    assert BAD_SECRET not in everything and "canary-TOKEN" not in everything
    sources.put(level, BAD_KEY, BAD_SECRET, s.endpoint_url)  # a long-term key id: no word
    with pytest.raises(errors.PermissionDeniedError) as info:
        await tensorstream.read_range(f"s3://{S3_BUCKET}/anything", 0, 1, **sources.options)
    assert "temporary" not in str(info.value)


@pytest.mark.parametrize("how", ["directory", "dangling link", "unreadable"])
async def test_a_named_profile_in_an_aws_config_that_cannot_be_read_says_so(
    sources: Sources, moto_s3: MotoS3Server, how: str
) -> None:
    # botocore reads nothing from it (configparser skips the OSError): the profile was
    # "not defined in" a file that may well define it.
    path = sources.aws_config
    path.unlink()
    if how == "directory":
        path.mkdir()
    elif how == "dangling link":
        path.symlink_to(path.parent / "gone")
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path.write_text("[profile work]\nregion = us-east-1\n")
        path.chmod(0)
    with pytest.raises(errors.ConfigurationError) as info:
        await tensorstream.stat(f"s3://{S3_BUCKET}/x", s3_endpoint=moto_s3.endpoint_url,
                                s3_profile="work", retries=1)
    said = str(info.value)
    assert f"cannot read the AWS config file {path}" in said and "not defined" not in said, said
    assert "profile 'work' (option s3_profile)" in said


def test_an_s3cmd_config_that_cannot_be_read_says_why(isolated_env: Path) -> None:
    # Every failure to open it was "not a regular file": a missing s3_config_path too.
    missing = isolated_env / "missing.s3cfg"
    with pytest.raises(errors.ConfigurationError, match="No such file or directory"):
        resolve_s3_credentials({"s3_config_path": str(missing)}, env={})
    with pytest.raises(errors.ConfigurationError, match=r": a directory$"):
        resolve_s3_credentials({"s3_config_path": str(isolated_env)}, env={})
