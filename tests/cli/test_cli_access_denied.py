"""A recursive ``cp``/``sync`` from S3 where some objects are refused (403: a bucket policy
denying ``s3:GetObject`` on some keys; here the package's fault proxy in front of moto
answers 403 to every request for them, HEAD and GET), against what ``aws s3 cp
--recursive`` and s5cmd do: one error line per refused object naming it (escaped as every
line is), the other objects copied, a summary, a non-zero exit (aws and s5cmd: 1;
tensorstream: 3 when some were copied, 1 when none was, as docs/cli.md says)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cli_env import cli

#: (command, destination): into a directory (GET refused), copied by S3 (its HEAD of the
#: source refused), streamed between two key pairs' worth of options (HEAD refused).
_WAYS = {
    "cp -r into a directory": (["cp", "-r"], "local"),
    "cp -r copied by S3": (["cp", "-r"], "s3"),
    "cp -r streamed": (["cp", "-r", "--no-server-side-copy"], "s3"),
    "sync into a directory": (["sync"], "local"),
    "sync copied by S3": (["sync"], "s3"),
}


@pytest.mark.parametrize("way", list(_WAYS))
def test_objects_refused_to_a_recursive_copy_each_say_so_and_the_others_are_copied(
        tmp_path: Path, tensorstream_s3: Any, way: str) -> None:
    b = tensorstream_s3
    command, into = _WAYS[way]
    # A name with a control character cannot be a local file (refused by name there):
    # into S3 it shows the refused object's name escaped.
    odd = "src/deny/c\x1b[2Jx\r.bin" if into == "s3" else "src/deny/c é%.bin"
    escaped = odd.replace("\x1b", "\\x1b").replace("\r", "\\r")
    data = {k: os.urandom(1000) for k in ("src/a.bin", "src/z/b.bin", odd, "src/deny/d.bin")}
    for key, body in data.items():
        b.client.put_object(Bucket=b.bucket, Key=key, Body=body)
    b.faults.raw.path_prefix = f"/{b.bucket}/src/deny"
    b.faults.raw.status_script = [403] * 50
    env = {**os.environ, **b.env, "HOME": str(tmp_path)}
    dst = str(tmp_path / "out") if into == "local" else b.uri("dst/")
    try:
        r = cli(*command, "--no-progress", b.uri("src/"), dst, env=env)
        assert r.returncode == 3, r.stderr
        errors = [line for line in r.stderr.splitlines()
                  if line.startswith("tensorstream: error: ")]
        assert len(errors) == 2, r.stderr
        assert "\x1b" not in r.stderr + r.stdout and "\r" not in r.stderr + r.stdout
        for key in (escaped, "src/deny/d.bin"):
            (line,) = [e for e in errors if e.startswith(f"tensorstream: error: {b.uri(key)} -> ")]
            assert "refused" in line and ("403" in line or "AccessDenied" in line), line
        assert sorted(r.stdout.splitlines()) == [
            f"copy: {b.uri(k)} -> {dst.rstrip('/')}/{k.removeprefix('src/')}"
            + (" (copied by S3, ETag compared)" if "copied by S3" in way else "")
            for k in ("src/a.bin", "src/z/b.bin")]
        assert r.stderr.splitlines()[-1].startswith("copied 2 files"), r.stderr
        assert r.stderr.splitlines()[-1].endswith("; 2 failed"), r.stderr
        for key in ("src/a.bin", "src/z/b.bin"):
            got = ((tmp_path / "out" / key.removeprefix("src/")).read_bytes() if into == "local"
                   else b.get(key.replace("src/", "dst/", 1)))
            assert got == data[key]
        # The neighbours: --json gives each refused object a failed line and the summary
        # counts them; every object refused is exit 1.
        r = cli(*command, "--json", b.uri("src/"), dst, env=env)
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        failed = sorted(x["src"] for x in lines if x.get("status") == "failed")
        assert failed == sorted([b.uri(odd), b.uri("src/deny/d.bin")]), lines
        r = cli(*command, "--no-progress", b.uri("src/deny/"), f"{dst.rstrip('/')}/2/",
                env=env)
        assert r.returncode == 1, r.stderr
        assert len([x for x in r.stderr.splitlines() if x.startswith("tensorstream: error:")]) == 2
    finally:
        b.faults.raw.reset()
        for key in (odd, odd.replace("src/", "dst/", 1)):  # (moto's DeleteObjects XML chokes)
            b.client.delete_object(Bucket=b.bucket, Key=key)


def test_a_policy_denying_some_keys_fails_those_and_copies_the_rest(
        tmp_path: Path, moto_s3: Any) -> None:
    """The same with a real policy (moto's IAM): a key pair denied ``s3:GetObject`` under
    one prefix, copied into a directory. Each denied object is its own error line naming
    it, the rest are copied, exit 3. (moto lets such a key pair HEAD and CopyObject the
    objects, which S3 refuses: the copy by S3 is the fault proxy's case above.)"""
    import secrets

    from cli_env import s3_env
    from fixtures_s3 import S3_BUCKET
    from iam_users import iam_user_keys

    p = f"denied-{secrets.token_hex(4)}"
    for key in ("a.bin", "deny/b.bin", "deny/c.bin", "z.bin"):
        moto_s3.client.put_object(Bucket=S3_BUCKET, Key=f"{p}/src/{key}", Body=key.encode())
    keys = iam_user_keys(moto_s3, "partial-reader", [
        {"Effect": "Allow", "Action": "s3:*",
         "Resource": [f"arn:aws:s3:::{S3_BUCKET}", f"arn:aws:s3:::{S3_BUCKET}/*"]},
        {"Effect": "Deny", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{S3_BUCKET}/{p}/src/deny/*"}])
    env = s3_env(moto_s3, tmp_path)
    env.update(AWS_ACCESS_KEY_ID=keys["s3_access_key_id"],
               AWS_SECRET_ACCESS_KEY=keys["s3_secret_access_key"])
    src = f"s3://{S3_BUCKET}/{p}/src/"
    dst = str(tmp_path / "out")
    r = cli("--endpoint-url", moto_s3.endpoint_url, "cp", "-r", "--no-progress", src, dst,
            env=env)
    assert r.returncode == 3, r.stderr
    errors = sorted(line.split(" -> ")[0] for line in r.stderr.splitlines()
                    if line.startswith("tensorstream: error: "))
    assert errors == [f"tensorstream: error: {src}deny/{n}" for n in ("b.bin", "c.bin")], r.stderr
    assert r.stderr.splitlines()[-1].startswith("copied 2 files"), r.stderr
    assert "; 2 failed" in r.stderr.splitlines()[-1]
    for key in ("a.bin", "z.bin"):
        assert (tmp_path / "out" / key).read_bytes() == key.encode()
    assert not (tmp_path / "out" / "deny").exists() or not any((tmp_path / "out" / "deny").iterdir())
