"""``tensorstream cp`` within one S3 store: the real CLI in a subprocess against moto.
Each copied line says S3 copied it and what was compared; ``--no-server-side-copy``
streams the bytes as before (and its lines say nothing of S3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_env import cli, s3_env

S3_BUCKET = "tensorstream-tests"


def test_cp_says_s3_copied_it_and_the_flag_turns_it_off(tmp_path: Path, moto_s3: Any) -> None:
    env = s3_env(moto_s3, tmp_path)
    moto_s3.put(S3_BUCKET, "srvcp/src/a.bin", b"a" * 1000)
    src, dst = f"s3://{S3_BUCKET}/srvcp/src/", f"s3://{S3_BUCKET}/srvcp/dst/"
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "-r", "--no-progress", src, dst,
            env=env)
    assert r.returncode == 0, r.stderr
    assert "(copied by S3, ETag compared)" in r.stdout, r.stdout
    assert ", verified" in r.stderr
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "-r", "--json", src,
            f"s3://{S3_BUCKET}/srvcp/json/", env=env)
    line = json.loads(r.stdout.splitlines()[0])
    assert line["server_side"] is True and line["verified_by"] == "ETag" and line["verified"]
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "-r", "--no-progress", "--no-verify",
            src, f"s3://{S3_BUCKET}/srvcp/unverified/", env=env)
    assert r.returncode == 0, r.stderr
    assert "(copied by S3, not verified)" in r.stdout and ", verified" not in r.stderr
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "-r", "--json",
            "--no-server-side-copy", src, f"s3://{S3_BUCKET}/srvcp/streamed/", env=env)
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout.splitlines()[0])
    assert line["status"] == "copied" and line["verified"] and "server_side" not in line
    assert moto_s3.get(S3_BUCKET, "srvcp/streamed/a.bin") == b"a" * 1000
    r = cli("cp", "--help", env=env)
    assert "--no-server-side-copy" in r.stdout


def test_a_warning_naming_a_key_escapes_its_control_characters(
        tmp_path: Path, tensorstream_s3: Any) -> None:
    """A warning the copy logs (here: S3 refused the source's HEAD, so the object is
    streamed instead) named the key as it is: an escape sequence in it reached the
    terminal and a carriage return overwrote the line. It is escaped, as `cp`'s own
    lines are."""
    import os

    b = tensorstream_s3
    key = "src/e\x1b[2Jv\rforged.bin"
    data = os.urandom(1000)
    b.client.put_object(Bucket=b.bucket, Key=key, Body=data)
    b.faults.raw.path_prefix = f"/{b.bucket}/src/e"
    b.faults.raw.status_script = [400, 400]
    env = {**os.environ, **b.env, "HOME": str(tmp_path)}
    r = cli("cp", "-r", b.uri("src/"), b.uri("dst/"), env=env)
    assert r.returncode == 0, r.stderr
    assert "copying it through this machine instead" in r.stderr
    assert "\x1b" not in r.stderr + r.stdout and "\r" not in r.stderr + r.stdout
    assert "e\\x1b[2Jv\\rforged.bin" in r.stderr
    assert b.get(key.replace("src/", "dst/")) == data
