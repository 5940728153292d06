"""``sync X X``: source and destination the same place. The real CLI in a subprocess
against local files, moto and redis on loopback."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli, s3_env

S3_BUCKET = "tensorstream-tests"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.parametrize("dryrun", [[], ["--dryrun"]])
def test_sync_of_a_directory_onto_itself_is_refused_once(tmp_path: Path, dryrun: list[str]) -> None:
    """``sync X X`` printed one 'same object' error per file and exited 1; it is refused
    once, before anything is listed, with exit 2 (as a usage error). The same directory
    by another path (``X/../X/``, a link to it) too."""
    src = tmp_path / "m"
    (src / "sub").mkdir(parents=True)
    for name in ("a.bin", "sub/b.bin", "c.bin"):
        (src / name).write_bytes(b"weights")
    (tmp_path / "link").symlink_to(src)
    for dst, delete in ((src, []), (f"{src}/", []), (src / ".." / "m", []),
                        (tmp_path / "link", []), (src, ["--delete"]), (f"{src}/.", ["--delete"])):
        # (with --delete it was "SRC inside DST: it would delete the source itself")
        r = cli("sync", *dryrun, *delete, str(src), str(dst))
        assert r.returncode == 2, r.stderr
        assert len(_errors(r.stderr)) == 1, r.stderr
        assert "same place" in r.stderr and "nothing to copy" in r.stderr, r.stderr
        assert r.stdout == ""
    assert (src / "sub" / "b.bin").read_bytes() == b"weights"
    # The neighbour: into a directory of its own is a copy (not refused here).
    r = cli("sync", str(src / "sub"), str(src / "other"))
    assert r.returncode == 0, r.stderr
    assert (src / "other" / "b.bin").read_bytes() == b"weights"


def test_sync_of_an_s3_prefix_onto_itself_is_refused_once(tmp_path: Path, moto_s3: Any) -> None:
    env = s3_env(moto_s3, tmp_path)
    p = f"same-{secrets.token_hex(4)}"
    for key in (f"{p}/a", f"{p}/b/c"):
        moto_s3.put(S3_BUCKET, key, b"x")
    before = moto_s3.client.head_object(Bucket=S3_BUCKET, Key=f"{p}/a")["LastModified"]
    for dst in (f"s3://{S3_BUCKET}/{p}", f"s3://{S3_BUCKET}/{p}/"):
        r = cli("--endpoint-url", moto_s3.endpoint_url, "sync", f"s3://{S3_BUCKET}/{p}/",
                dst, env=env)
        assert r.returncode == 2, r.stderr
        assert len(_errors(r.stderr)) == 1 and "same place" in r.stderr, r.stderr
        assert "--metadata" in r.stderr  # what to give to change them in place
    assert moto_s3.client.head_object(Bucket=S3_BUCKET, Key=f"{p}/a")["LastModified"] == before


@pytest.mark.parametrize("flags", [["--metadata", "k=v"], ["--copy-props", "none"],
                                   ["--copy-props", "metadata-directive"]])
def test_sync_changing_metadata_in_place_still_runs(tmp_path: Path, moto_s3: Any,
                                                    flags: list[str]) -> None:
    """The in-place S3 changes aws s3 allows (fields given, tags dropped) are not refused."""
    env = s3_env(moto_s3, tmp_path)
    p = f"inplace-{secrets.token_hex(4)}"
    moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{p}/m.json", Body=b"{}",
                              Metadata={"old": "1"}, Tagging="t=1")
    r = cli("--endpoint-url", moto_s3.endpoint_url, "sync", *flags, f"s3://{S3_BUCKET}/{p}/",
            f"s3://{S3_BUCKET}/{p}/", env=env)
    assert r.returncode == 0, r.stderr
    assert moto_s3.get(S3_BUCKET, f"{p}/m.json") == b"{}"
    tags = moto_s3.client.get_object_tagging(Bucket=S3_BUCKET, Key=f"{p}/m.json")["TagSet"]
    if flags[0] == "--metadata":  # fields given replace, the tags kept
        head = moto_s3.client.head_object(Bucket=S3_BUCKET, Key=f"{p}/m.json")
        assert head["Metadata"] == {"k": "v"} and tags == [{"Key": "t", "Value": "1"}]
    else:  # (as aws s3 cp's REPLACE directives, the tags dropped)
        assert tags == []


def test_sync_of_a_redis_prefix_onto_itself_is_refused_once(redis_server: Any) -> None:
    key = f"rsame-{os.getpid()}"
    with redis_server.client() as c:
        c.set(f"{key}/a", b"x")
        c.set(f"{key}/b", b"y")
    r = cli("sync", redis_server.url(f"{key}/"), f"redis://localhost:{redis_server.port}/{key}/")
    assert r.returncode == 2, r.stderr
    assert len(_errors(r.stderr)) == 1 and "same place" in r.stderr, r.stderr
