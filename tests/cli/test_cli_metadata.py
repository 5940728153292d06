"""``tensorstream cp/sync --content-type/--cache-control/--metadata/--no-guess-mime-type``:
the real CLI in a subprocess against moto on loopback, read back with HEAD."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, s3_env

S3_BUCKET = "tensorstream-tests"


def _head(server: Any, key: str) -> dict[str, Any]:
    return dict(server.client.head_object(Bucket=S3_BUCKET, Key=key))


@pytest.mark.parametrize("command", ["cp", "sync"])
def test_flags_named_as_aws_s3_cp_set_what_s3_stores(
        tmp_path: Path, moto_s3: Any, command: str) -> None:
    env = s3_env(moto_s3, tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    p = f"climeta-{secrets.token_hex(4)}"
    args = ["-r"] if command == "cp" else []
    r = cli("--endpoint-url", moto_s3.endpoint_url, command, *args, "--content-type",
            "application/x-cfg", "--cache-control", "max-age=5", "--metadata", "a=1,B=2",
            "--metadata", '{"c": "x,y"}', str(tmp_path / "m"), f"s3://{S3_BUCKET}/{p}/",
            env=env)
    assert r.returncode == 0, r.stderr
    head = _head(moto_s3, f"{p}/config.json")
    assert head["ContentType"] == "application/x-cfg" and head["CacheControl"] == "max-age=5"
    assert head["Metadata"] == {"a": "1", "b": "2", "c": "x,y"}
    # The neighbours: guessed by default, and not with --no-guess-mime-type.
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", str(tmp_path / "m" / "config.json"),
            f"s3://{S3_BUCKET}/{p}/g.json", env=env)
    assert r.returncode == 0, r.stderr
    assert _head(moto_s3, f"{p}/g.json")["ContentType"] == "application/json"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "--no-guess-mime-type",
            str(tmp_path / "m" / "config.json"), f"s3://{S3_BUCKET}/{p}/n.json", env=env)
    assert r.returncode == 0, r.stderr
    assert _head(moto_s3, f"{p}/n.json")["ContentType"] == "binary/octet-stream"


def test_stdin_into_s3_takes_the_flags(tmp_path: Path, moto_s3: Any) -> None:
    env = s3_env(moto_s3, tmp_path)
    key = f"climeta-{secrets.token_hex(4)}/s.json"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "--metadata", "k=v", "-",
            f"s3://{S3_BUCKET}/{key}", env=env, input="{}")
    assert r.returncode == 0, r.stderr
    head = _head(moto_s3, key)
    assert head["Metadata"] == {"k": "v"} and head["ContentType"] == "binary/octet-stream"


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--metadata", "tok=s3cr\u00e9t-value", "printable US-ASCII"),
    ("--metadata", "tok=line\nbreak-s3cret", "printable US-ASCII"),
    ("--metadata", "bad key=s3cret", "cannot be an S3 metadata name"),
    ("--metadata", "a=1,s3cret", "not KEY=VALUE"),
    ("--metadata", "a=1,A=2", "given twice"),
    ("--metadata", "big=" + "x" * 3000, "at most 2048 bytes"),
    ("--content-type", "text/plain\r\nX-Evil: s3cret", "printable US-ASCII"),
])
def test_a_bad_value_is_a_usage_error_that_does_not_show_it(
        tmp_path: Path, moto_s3: Any, flag: str, value: str, says: str) -> None:
    env = s3_env(moto_s3, tmp_path)
    (tmp_path / "a.json").write_text("{}")
    key = f"climeta-{secrets.token_hex(4)}/a.json"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", flag, value,
            str(tmp_path / "a.json"), f"s3://{S3_BUCKET}/{key}", env=env)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "s3cret" not in r.stderr, r.stderr
    assert not moto_s3.exists(S3_BUCKET, key)


def test_flags_for_a_local_destination_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    r = cli("cp", "--content-type", "text/plain", str(tmp_path / "a.json"),
            str(tmp_path / "b.json"))
    assert r.returncode != 0 and "keeps none" in r.stderr, r.stderr
    assert not (tmp_path / "b.json").exists()
    r = cli("cp", "--metadata", "a=1", "-", str(tmp_path / "c.json"), input="x")
    assert r.returncode == 2 and "keeps none" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["cp", "sync"])
@pytest.mark.parametrize("props", ["default", "metadata-directive", "none"])
def test_copy_props_as_aws_s3_cp(tmp_path: Path, moto_s3: Any, command: str,
                                 props: str) -> None:
    """``--copy-props`` from S3 to S3 through the CLI (copied by S3 in one CopyObject):
    the source's fields and tags, its fields alone, or nothing of it."""
    env = s3_env(moto_s3, tmp_path)
    p = f"cliprops-{secrets.token_hex(4)}"
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{p}/a/m.json", Body=b"{}",
                              ContentType="x/model", Metadata={"k": "v"}, Tagging="t=1")
    args = ["-r"] if command == "cp" else []
    r = cli("--endpoint-url", moto_s3.endpoint_url, command, *args, "--copy-props", props,
            f"s3://{S3_BUCKET}/{p}/a/", f"s3://{S3_BUCKET}/{p}/b/", env=env)
    assert r.returncode == 0, r.stderr
    head = _head(moto_s3, f"{p}/b/m.json")
    tags = moto_s3.client.get_object_tagging(Bucket=S3_BUCKET, Key=f"{p}/b/m.json")["TagSet"]
    carried = props != "none"
    assert head["ContentType"] == ("x/model" if carried else "application/json")
    assert head["Metadata"] == ({"k": "v"} if carried else {})
    assert tags == ([{"Key": "t", "Value": "1"}] if props == "default" else [])


def test_a_tag_set_too_large_for_a_header_through_the_cli(
        tmp_path: Path, tensorstream_s3: Any) -> None:
    """``cp`` streamed (``--no-server-side-copy``) of an object with S3's largest tag set:
    the upload's 4 KB ``x-amz-tagging`` header was refused (400) and the copy failed; the
    tags are set after the upload now (exit 0). Refused then (403), the copy fails with
    exit 1, says the object was written and removed and why, and leaves nothing."""
    import os

    b = tensorstream_s3
    tags = [{"Key": f"{i}" + "k" * 127, "Value": "v" * 256} for i in range(10)]
    b.client.put_object(Bucket=b.bucket, Key="src.bin", Body=b"x" * 100)
    b.client.put_object_tagging(Bucket=b.bucket, Key="src.bin", Tagging={"TagSet": tags})
    env = {**os.environ, **b.env, "HOME": str(tmp_path)}
    r = cli("cp", "--no-server-side-copy", "--no-progress", b.uri("src.bin"),
            b.uri("dst.bin"), env=env)
    assert r.returncode == 0, r.stderr
    assert b.client.get_object_tagging(Bucket=b.bucket, Key="dst.bin")["TagSet"] == tags
    b.faults.raw.query = "tagging"
    b.faults.raw.status_script = [200, 403]
    r = cli("cp", "--no-server-side-copy", "--no-progress", b.uri("src.bin"),
            b.uri("refused.bin"), env=env)
    assert r.returncode == 1, r.stderr
    assert "the object was written, but its 10 tags" in r.stderr, r.stderr
    assert "s3:PutObjectTagging" in r.stderr and "removed again" in r.stderr
    assert "Contents" not in b.client.list_objects_v2(Bucket=b.bucket, Prefix="refused")
