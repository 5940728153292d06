"""The one classifier of secret-looking names (credentials/base.py), as both of its users
apply it: describe_credentials for other schemes, and the tensorizer settings' repr and
pickling. Each used to keep its own list; each word either knew is a secret to both."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.credentials.base import SECRET_WORDS, is_secret_name
from tensorstream.providers.registry import known_option_names
from tensorstream.tensorizer.config import TensorizerConfig

#: A name with each word either list had (describe: credential, auth; tensorizer: passphrase).
NAMES = ["s3_secret_access_key", "redis_password", "passphrase", "bearer_token", "api_key",
         "gcs_credentials", "Auth", "PASSPHRASE_FILE_TEXT"]


def test_every_word_either_list_knew_is_in_the_one_list() -> None:
    assert set(SECRET_WORDS) >= {"secret", "password", "token", "key", "credential", "auth",
                                 "passphrase"}
    assert all(is_secret_name(n) for n in NAMES)
    assert not any(is_secret_name(n) for n in ("region", "endpoint", "timeout_idle", "db"))


@pytest.mark.parametrize("name", NAMES)
def test_describe_credentials_masks_each(isolated_env: Path, name: str) -> None:
    report = tensorstream.describe_credentials(
        "memory://bucket/x", storage_options={name: "canary-value", "region": "r1"})
    assert "canary-value" not in str(report) and "'region': 'r1'" in str(report)


@pytest.mark.parametrize("name", NAMES)
def test_tensorizer_settings_mask_and_refuse_to_pickle_each(name: str) -> None:
    # An option no service takes is refused when the config is made, its value unshown;
    # one that is taken (or any name in fsspec's storage_options) is masked.
    for options in ({name: "canary-value"}, {"storage_options": {name: "canary-value"}}):
        try:
            config = TensorizerConfig(tensorizer_uri="s3://b/m",
                                      stream_kwargs={**options, "timeout_idle": 5})
        except errors.ConfigurationError as exc:
            assert name not in known_option_names() and f"unknown option {name}" in str(exc)
            assert "canary-value" not in str(exc)
            continue
        assert "canary-value" not in repr(config)
        with pytest.raises(TypeError, match="refusing to pickle"):
            pickle.dumps(config)


def test_an_access_key_id_is_still_shown_by_the_tensorizer_settings() -> None:
    config = TensorizerConfig(tensorizer_uri="s3://b/m",
                              stream_kwargs={"s3_access_key_id": "AKIAEXAMPLE"})
    assert "AKIAEXAMPLE" in repr(config)


def test_a_mapping_under_a_secret_name_is_masked_whole(isolated_env: Path) -> None:
    """Both users recursed into it and checked only the inner names: ``auth={"user": ...,
    "pw": ...}`` and ``credentials={"u": ...}`` were shown in clear."""
    report = tensorstream.describe_credentials(
        "memory://bucket/x", storage_options={"auth": {"user": "u", "pw": "canary-1"},
                                              "client_kwargs": {"region": "r1"}})
    assert "canary-1" not in str(report) and "'region': 'r1'" in str(report)
    config = TensorizerConfig(tensorizer_uri="s3://b/m", stream_kwargs={"storage_options": {
        "credentials": {"u": "canary-2"}, "password": "canary-3", "region": "r2"}})
    assert "canary-2" not in repr(config) and "canary-3" not in repr(config)
    assert "'region': 'r2'" in repr(config)
    with pytest.raises(TypeError, match="refusing to pickle"):
        pickle.dumps(TensorizerConfig(tensorizer_uri="s3://b/m", stream_kwargs={
            "storage_options": {"credentials": {"u": "canary-2"}}}))
