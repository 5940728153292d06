"""``tensorstream cp`` within one S3 store, what its lines and summary say of bytes S3
copied itself: the real CLI in a subprocess against moto."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_env import cli, s3_env

S3_BUCKET = "tensorstream-tests"


def test_the_summary_gives_no_rate_for_bytes_s3_copied(tmp_path: Path, moto_s3: Any) -> None:
    """``copied 2 files (5.72 MiB) in 1.25 s, 4.56 MiB/s`` for a copy S3 made itself: a
    rate of bytes that never crossed this machine (100 GiB copied by S3 in 20 s read
    "5 GiB/s"). Now the summary says S3 copied them and gives no rate; ``--json``'s
    summary has ``server_side_bytes`` and a ``gbps`` of 0; a streamed copy keeps its rate."""
    env = s3_env(moto_s3, tmp_path)
    for name in ("a", "b"):
        moto_s3.put(S3_BUCKET, f"srvsum/src/{name}.bin", name.encode() * 1_500_000)
    src, dst = f"s3://{S3_BUCKET}/srvsum/src/", f"s3://{S3_BUCKET}/srvsum/dst/"
    base = ("--endpoint-url", moto_s3.endpoint_url)
    r = cli(*base, "cp", "-r", "--no-progress", src, dst, env=env)
    assert r.returncode == 0, r.stderr
    summary = r.stderr.strip().splitlines()[-1]
    assert summary.startswith("copied 2 files (2.86 MiB) in "), summary
    assert "/s" not in summary and "copied by S3" in summary and summary.endswith(
        ", verified"), summary
    r = cli(*base, "cp", "-r", "--json", src, f"s3://{S3_BUCKET}/srvsum/json/", env=env)
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.splitlines()[-1])
    assert last["op"] == "summary" and last["server_side_bytes"] == 3_000_000
    assert last["gbps"] == 0 and "/s" not in last["summary"], last
    r = cli(*base, "cp", "-r", "--no-progress", "--no-server-side-copy", src,
            f"s3://{S3_BUCKET}/srvsum/streamed/", env=env)
    assert r.returncode == 0, r.stderr
    summary = r.stderr.strip().splitlines()[-1]
    assert "/s" in summary and "S3" not in summary, summary

