"""S3 object metadata values checked by S3's rules before anything is sent, and the
``--metadata`` forms of aws s3 cp and s5cmd (no I/O here: the round trips through moto
are tests/copy/test_copy_metadata.py and tests/cli/test_cli_metadata.py)."""

from __future__ import annotations

import pytest

from tensorstream.errors import ConfigurationError
from tensorstream.providers.s3.metadata import (
    USER_METADATA_MAX,
    MetadataOptions,
    carried_from_headers,
    parse_metadata_args,
    validate_user_metadata,
)


def test_the_forms_of_aws_and_s5cmd_make_one_mapping() -> None:
    assert parse_metadata_args(["a=1,b=x=y", "c=", '{"D": "p,q"}']) == {
        "a": "1", "b": "x=y", "c": "", "d": "p,q"}


@pytest.mark.parametrize("args", [["a"], ["=v"], ["a=1,"], ["{not json"], ['{"a": 1}'],
                                  ['["a"]'], ["a=1", "A=2"], ["a=1,a=2"],
                                  # (the JSON form kept the last of a name given twice)
                                  ['{"a": "1", "a": "2"}'], ['{"a": "1", "A": "2"}'],
                                  ['{"a": {"b": "c"}}']])
def test_malformed_metadata_arguments_are_refused(args: list[str]) -> None:
    with pytest.raises(ConfigurationError, match="--metadata"):
        parse_metadata_args(args)


def test_user_metadata_up_to_s3s_limit_and_not_a_byte_more() -> None:
    fits = {"k": "v" * (USER_METADATA_MAX - 1)}
    assert validate_user_metadata(fits) == fits
    with pytest.raises(ConfigurationError, match="2049 bytes"):
        validate_user_metadata({"k": "v" * USER_METADATA_MAX})


@pytest.mark.parametrize("bad", [{"k": "caf\u00e9"}, {"k": "a\tb"}, {"k": "a\x7f"},
                                 {"k y": "v"}, {"": "v"}, {"k:": "v"}, {"k": 1},
                                 # (a line break at the end passed: '$' matches before it)
                                 {"k": "caf\n"}, {"k\n": "v"}])
def test_values_and_keys_s3_does_not_take_are_refused_without_showing_the_value(
        bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_user_metadata(bad)  # type: ignore[arg-type]
    assert "caf" not in str(caught.value)


@pytest.mark.parametrize("value", ["text/plain\r\nX-Injected: 1", "text/plain\n"])
def test_content_type_with_a_line_break_is_refused(value: str) -> None:
    # One at the end passed the check, and the upload failed as "cannot reach
    # http://127.0.0.1:...: HTTPClientError" (http.client refused the header), retried.
    with pytest.raises(ConfigurationError, match="US-ASCII"):
        MetadataOptions(content_type=value)
    with pytest.raises(ConfigurationError, match="US-ASCII"):
        MetadataOptions(cache_control=value)
    with pytest.raises(ConfigurationError):
        parse_metadata_args(["sha=" + value.rpartition("/")[2]])


def test_fields_given_go_over_the_sources_and_empty_metadata_clears_it() -> None:
    source = {"ContentType": "x/y", "CacheControl": "no-cache", "Metadata": {"a": "1"}}
    assert MetadataOptions().for_object("m.json", source) == source
    assert MetadataOptions(metadata={}).for_object("m.json", source) == {
        "ContentType": "x/y", "CacheControl": "no-cache"}
    assert MetadataOptions(content_type="t/u").for_object("m.json", None) == {
        "ContentType": "t/u"}
    assert MetadataOptions().for_object("m.json", None) == {"ContentType": "application/json"}
    assert MetadataOptions(guess_mime_type=False).for_object("m.json", None) == {}
    assert MetadataOptions().for_object("model.safetensors", None) == {}


def test_raw_headers_give_what_a_copy_carries() -> None:
    assert carried_from_headers({"content-type": "x/y", "x-amz-meta-sha": "abc",
                                 "etag": '"e"', "expires": "Thu, 01 Jan 2031 00:00:00 GMT"}) == {
        "ContentType": "x/y", "Metadata": {"sha": "abc"},
        "Expires": "Thu, 01 Jan 2031 00:00:00 GMT"}


def test_a_sources_metadata_s3_would_refuse_is_said_before_botocore_quotes_it() -> None:
    """A store that hands back raw UTF-8 (read as Latin-1): botocore refused it quoting
    the value; now refused naming the key, and --metadata given replaces it."""
    source = {"Metadata": {"k": "caf\u00c3\u00a9"}}
    with pytest.raises(ConfigurationError, match="source's user metadata") as caught:
        MetadataOptions().for_object("m", source)
    assert "caf" not in str(caught.value)
    assert MetadataOptions(metadata={"k": "v"}).for_object("m", source) == {
        "Metadata": {"k": "v"}}
