"""Object names in what the CLI prints for people: exactly the name, escaped where it
holds what a terminal would act on. Real moto on loopback; the CLI in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_env import s3_env
from fixtures_s3 import S3_BUCKET


def cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstream", *argv], capture_output=True,
                          text=True, timeout=120, env=env)


def test_an_error_names_a_key_with_its_runs_of_spaces(tmp_path: Path, moto_s3: Any) -> None:
    """``cat 's3://b/a  b'`` (two spaces) said ``no such object`` about ``a b``, another
    key (the line's words were joined by one space), and a key's trailing spaces were
    dropped. The error names the key as it is; a long key is still clipped."""
    env = s3_env(moto_s3, tmp_path)
    moto_s3.put(S3_BUCKET, "names/a b", b"the neighbour")
    for key in ("names/a  b", "names/a b  ", "names/a   b.bin"):
        r = cli("cat", f"s3://{S3_BUCKET}/{key}", "--endpoint-url", moto_s3.endpoint_url,
                env=env)
        assert r.returncode == 1
        assert f"{key}: no such object" in r.stderr, r.stderr
    long = "names/" + "x" * 1000
    r = cli("cat", f"s3://{S3_BUCKET}/{long}", "--endpoint-url", moto_s3.endpoint_url, env=env)
    assert r.returncode == 1 and "characters]..." in r.stderr and len(r.stderr) < 1000
